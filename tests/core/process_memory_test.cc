#include "shardtrain/core/process_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace st {
namespace {

TEST(ProcessMemory, HostAvailableIsPositiveAndBelowTheTotal) {
  const int64_t available = host_available_bytes();
  EXPECT_GT(available, int64_t{64} << 20);  // any machine that runs the tests has 64 MiB to spare
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t total_kib = 0;
  meminfo >> key >> total_kib;  // the first line: MemTotal
  ASSERT_EQ(key, "MemTotal:");
  EXPECT_LE(available, total_kib * 1024);
}

TEST(ProcessMemory, PeakRssGrowsWithTouchedMemoryAndNeverShrinks) {
  const int64_t before = process_peak_rss_bytes();
  EXPECT_GT(before, 1 << 20);  // any process holds more than 1 MiB
  constexpr size_t kBytes = size_t{256} << 20;
  {
    std::vector<char> big(kBytes);
    std::memset(big.data(), 1, big.size());  // resident only once written
    volatile char sink = big[kBytes / 2];
    (void)sink;
  }
  const int64_t after = process_peak_rss_bytes();
  // The 256 MiB were resident at once, on top of at least part of what was there before.
  EXPECT_GE(after, static_cast<int64_t>(kBytes));
  EXPECT_GE(after, before);
  EXPECT_EQ(process_peak_rss_bytes(), after);  // freed memory does not lower the peak
}

}  // namespace
}  // namespace st
