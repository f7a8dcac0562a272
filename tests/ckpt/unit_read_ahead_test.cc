// UnitReadAhead (ckpt/unit_read_ahead.h): the units in order with their values, buffers the taker leaves going back
// to the read, one unit waiting at most, the read's error after the units before it, and a taker's error or an early
// destruction stopping the read.
#include "shardtrain/ckpt/unit_read_ahead.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ckpt_test_util.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

// A read of `units` units, unit u holding u + 1 elements of value u (in whatever buffer the sink handed back, as
// StreamViews does), counting the sink's returns in *given and noting the buffers it was handed back with memory.
UnitReadAhead::Read counting_read(int units, std::atomic<int>* given, std::atomic<int>* reused = nullptr) {
  return [=](const UnitSink& sink) {
    std::vector<float> values;
    for (int u = 0; u < units; ++u) {
      if (reused != nullptr && values.capacity() > 0) ++*reused;
      values.assign(static_cast<size_t>(u + 1), static_cast<float>(u));
      sink(u, values);
      ++*given;
    }
  };
}

// Waits (up to 10 s) until the read has given `n` units.
void wait_for(const std::atomic<int>& given, int n) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (given < n && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_GE(given.load(), n);
}

TEST(UnitReadAhead, TheUnitsComeInOrderWithTheirValues) {
  std::atomic<int> given{0}, reused{0};
  UnitReadAhead ahead(counting_read(50, &given, &reused));
  std::vector<int> order;
  ahead.drain([&](int u, std::vector<float>& values) {
    order.push_back(u);
    ASSERT_EQ(values.size(), static_cast<size_t>(u + 1)) << u;
    for (float v : values) ASSERT_EQ(v, static_cast<float>(u)) << u;
  });
  ASSERT_EQ(order.size(), 50u);
  for (int u = 0; u < 50; ++u) EXPECT_EQ(order[static_cast<size_t>(u)], u);
  EXPECT_EQ(given.load(), 50);
  // The taker left every buffer: the read filled some of its later units in them (the first two have none to take).
  EXPECT_GT(reused.load(), 0);
  EXPECT_GE(ahead.waited_seconds(), 0.0);
}

// A taker that keeps each buffer (the CPU decoder does) leaves the read nothing to fill again.
TEST(UnitReadAhead, BuffersTheTakerKeepsDoNotGoBack) {
  std::atomic<int> given{0}, reused{0};
  UnitReadAhead ahead(counting_read(20, &given, &reused));
  std::vector<std::vector<float>> kept;
  ahead.drain([&](int, std::vector<float>& values) { kept.push_back(std::move(values)); });
  EXPECT_EQ(kept.size(), 20u);
  EXPECT_EQ(reused.load(), 0);
}

// Before drain, the read gives one unit and waits: the second is not handed on until the first is taken.
TEST(UnitReadAhead, OneUnitWaitsAtMost) {
  std::atomic<int> given{0};
  UnitReadAhead ahead(counting_read(10, &given));
  wait_for(given, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(given.load(), 1);  // the read holds its second unit until drain takes the first
  int taken = 0;
  ahead.drain([&](int, std::vector<float>&) { ++taken; });
  EXPECT_EQ(taken, 10);
  EXPECT_EQ(given.load(), 10);
}

// The read's error reaches drain's caller, with its kind and message, once the units read before it are taken.
TEST(UnitReadAhead, TheReadsErrorComesAfterTheUnitsBeforeIt) {
  UnitReadAhead ahead([](const UnitSink& sink) {
    std::vector<float> values(4, 1.0f);
    for (int u = 0; u < 3; ++u) sink(u, values);
    ST_BAD_INPUT("model.safetensors: tensor model.norm.weight holds NaN at [7]");
  });
  std::vector<int> taken;
  const std::string message = testing::error_message(
      ErrorKind::kBadInput, [&] { ahead.drain([&](int u, std::vector<float>&) { taken.push_back(u); }); });
  EXPECT_EQ(taken, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(testing::contains(message, "tensor model.norm.weight holds NaN at [7]")) << message;
}

// A taker's error leaves drain, and the read stops at its next unit instead of reading on.
TEST(UnitReadAhead, ATakersErrorStopsTheRead) {
  std::atomic<int> given{0};
  {
    UnitReadAhead ahead(counting_read(1000, &given));
    EXPECT_THROW(ahead.drain([](int u, std::vector<float>&) {
      if (u == 2) ST_FAULT("the device ran out of memory");
    }),
                 Error);
  }  // joined here
  EXPECT_LT(given.load(), 10);
}

// Destroyed before its drain (the device could not be opened), the read-ahead stops the read and joins it.
TEST(UnitReadAhead, DestroyedBeforeDrainStopsTheRead) {
  std::atomic<int> given{0};
  { UnitReadAhead ahead(counting_read(1000, &given)); }
  EXPECT_LE(given.load(), 1);
}

}  // namespace
}  // namespace st
