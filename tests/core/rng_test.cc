#include "shardtrain/core/rng.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace st {
namespace {

TEST(RngTest, NormalHasMeanZeroAndUnitStd) {
  constexpr int kN = 200000;
  double sum = 0, sum_sq = 0;
  for (int i = 0; i < kN; ++i) {
    const double x = normal_at(/*seed=*/1337, /*stream=*/7, i);
    ASSERT_TRUE(std::isfinite(x)) << i;
    sum += x;
    sum_sq += x * x;
  }
  const double mean = sum / kN;
  const double std = std::sqrt(sum_sq / kN - mean * mean);
  EXPECT_LT(std::abs(mean), 0.01) << mean;
  EXPECT_LT(std::abs(std - 1.0), 0.01) << std;
}

TEST(RngTest, ValuesArePureFunctionsOfSeedStreamIndex) {
  EXPECT_EQ(random_bits_at(1, 2, 3), random_bits_at(1, 2, 3));
  EXPECT_EQ(normal_at(1, 2, 3), normal_at(1, 2, 3));
  EXPECT_NE(random_bits_at(1, 2, 3), random_bits_at(2, 2, 3));  // seed matters
  EXPECT_NE(random_bits_at(1, 2, 3), random_bits_at(1, 3, 3));  // stream matters
  EXPECT_NE(random_bits_at(1, 2, 3), random_bits_at(1, 2, 4));  // index matters

  // A generator resumed at a counter continues the same sequence: its state is (seed, stream, counter).
  Rng a(42, 5);
  std::vector<uint64_t> first;
  for (int i = 0; i < 10; ++i) first.push_back(a.next_u64());
  EXPECT_EQ(a.counter(), 10u);
  Rng b(42, 5, /*counter=*/4);
  for (int i = 4; i < 10; ++i) EXPECT_EQ(b.next_u64(), first[i]) << i;
  EXPECT_EQ(first[3], random_bits_at(42, 5, 3));
}

TEST(RngTest, UniformIsInOpenUnitInterval) {
  for (uint64_t i = 0; i < 100000; ++i) {
    const double u = uniform_at(9, 0, i);
    ASSERT_GT(u, 0.0) << i;
    ASSERT_LT(u, 1.0) << i;
  }
}

TEST(RngTest, NextBelowStaysInRangeAndCoversIt) {
  for (uint64_t n : {1ull, 2ull, 7ull, 1000ull}) {
    Rng r(3, 1);
    std::vector<int> hits(n, 0);
    for (int i = 0; i < 20000; ++i) {
      const uint64_t v = r.next_below(n);
      ASSERT_LT(v, n);
      ++hits[v];
    }
    for (uint64_t v = 0; v < n; ++v) EXPECT_GT(hits[v], 0) << "n=" << n << " v=" << v;
    if (n == 7) {
      for (uint64_t v = 0; v < n; ++v) EXPECT_NEAR(hits[v], 20000.0 / 7, 200) << v;  // ~5 sigma
    }
  }
  Rng big(3, 2);
  const uint64_t n = (1ull << 63) + 12345;
  for (int i = 0; i < 1000; ++i) ASSERT_LT(big.next_below(n), n);
}

}  // namespace
}  // namespace st
