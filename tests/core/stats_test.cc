#include "shardtrain/core/stats.h"

#include <gtest/gtest.h>

#include <vector>

namespace st {
namespace {

TEST(StatsTest, MedianOfAnOddCountIsTheMiddleValue) {
  EXPECT_EQ(median({5.0}), 5.0);
  EXPECT_EQ(median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(median({9.0, -4.0, 7.0, 7.0, 0.5}), 7.0);
}

TEST(StatsTest, MedianOfAnEvenCountIsTheUpperMiddleValue) {
  EXPECT_EQ(median({1.0, 2.0}), 2.0);
  EXPECT_EQ(median({4.0, 1.0, 3.0, 2.0}), 3.0);
}

TEST(StatsTest, MedianOfNothingIsZero) { EXPECT_EQ(median({}), 0.0); }

TEST(StatsTest, MedianLeavesTheCallersVectorAlone) {
  const std::vector<double> v = {3.0, 1.0, 2.0};
  EXPECT_EQ(median(v), 2.0);
  EXPECT_EQ(v, (std::vector<double>{3.0, 1.0, 2.0}));
}

}  // namespace
}  // namespace st
