#include "shardtrain/shard/staging_ring.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <utility>

namespace st {
namespace {

TEST(StagingRing, PlacesAfterTheNewestAndWrapsToTheStart) {
  StagingRing r(100);
  EXPECT_EQ(r.take(40), 0);
  EXPECT_EQ(r.take(40), 40);
  EXPECT_EQ(r.take(30), std::nullopt);  // 20 left at the end, and the oldest still holds [0, 40)
  r.release_oldest();
  EXPECT_EQ(r.take(30), 0);             // wraps: [0, 40) is free again
  EXPECT_EQ(r.take(15), std::nullopt);  // wrapped: only [30, 40) lies between the newest and the oldest
  EXPECT_EQ(r.take(10), 30);
  r.release_oldest();                  // [40, 80): no longer wrapped, [0, 40) in use
  EXPECT_EQ(r.take(60), 40);           // the end of the ring, up to the capacity
  EXPECT_EQ(r.take(1), std::nullopt);  // full
  r.release_oldest();
  r.release_oldest();
  r.release_oldest();
  EXPECT_TRUE(r.empty());
  EXPECT_EQ(r.take(100), 0);  // an empty ring starts over at 0 and fits its whole capacity
}

TEST(StagingRing, RefusesWhatCanNeverFit) {
  StagingRing r(100);
  EXPECT_THROW(r.take(101), Error);
  EXPECT_THROW(r.take(0), Error);
  EXPECT_THROW(r.release_oldest(), Error);
}

// Random sizes up to half the ring, taken until refused and released oldest first: no two ranges held at once
// overlap, each lies inside the ring, and only a ring that holds something refuses.
TEST(StagingRing, RangesInUseNeverOverlap) {
  std::mt19937 rng(7);
  const int64_t capacity = 2 * staging_unit_bytes(1000, 2, OffloadMode::kOptimizer);
  StagingRing r(capacity);
  std::deque<std::pair<int64_t, int64_t>> held;
  std::uniform_int_distribution<int64_t> size(1, capacity / 2);
  int64_t taken = 0;
  for (int i = 0; i < 20000; ++i) {
    const int64_t bytes = size(rng);
    const std::optional<int64_t> at = r.take(bytes);
    if (!at) {
      ASSERT_FALSE(held.empty()) << "an empty ring of " << capacity << " refused " << bytes;
      r.release_oldest();
      held.pop_front();
      continue;
    }
    ASSERT_GE(*at, 0);
    ASSERT_LE(*at + bytes, capacity);
    for (const auto& [o, b] : held) ASSERT_TRUE(*at + bytes <= o || o + b <= *at) << "overlap at step " << i;
    held.emplace_back(*at, bytes);
    ++taken;
  }
  EXPECT_GT(taken, 10000);
}

// Units of one size, at most the largest's (the blocks beside the embedding or the head): two always fit at once.
TEST(StagingRing, EqualUnitsAreInFlightTwoAtATime) {
  const int64_t largest = 1000, block = 700;
  StagingRing r(2 * largest);
  std::deque<int64_t> held;
  for (int i = 0; i < 1000; ++i) {
    if (held.size() == 2) {
      r.release_oldest();
      held.pop_front();
    }
    const std::optional<int64_t> at = r.take(block);
    ASSERT_TRUE(at.has_value()) << "a ring of two of the largest refused a second unit at " << i;
    held.push_back(*at);
  }
}

TEST(StagingRing, SizesAUnitsGradientAndItsCopyUp) {
  // 1000 fp32 elements and 1000 bf16 ones, each rounded up to the 4 KiB alignment; params on the host: no copy up.
  EXPECT_EQ(staging_unit_bytes(1000, 2, OffloadMode::kOptimizer), 4096 + 4096);
  EXPECT_EQ(staging_unit_bytes(1000, 2, OffloadMode::kOptimizerParams), 4096);
  EXPECT_EQ(staging_unit_bytes(4096, 2, OffloadMode::kOptimizer), 16384 + 8192);
  EXPECT_EQ(staging_ring_bytes(4096, 2, OffloadMode::kOptimizer), 2 * (16384 + 8192));
}

}  // namespace
}  // namespace st
