#include "shardtrain/core/format.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

namespace st {
namespace {

TEST(FormatTest, MibHasTwoDecimals) {
  EXPECT_EQ(format_mib(0), "0.00 MiB");
  EXPECT_EQ(format_mib(int64_t{1} << 20), "1.00 MiB");
  EXPECT_EQ(format_mib(int64_t{3} << 19), "1.50 MiB");
  EXPECT_EQ(format_mib(int64_t{1} << 19), "0.50 MiB");
  EXPECT_EQ(format_mib(1), "0.00 MiB");  // under half of 0.01 MiB rounds to zero
  EXPECT_EQ(format_mib(int64_t{1068390} * 1048576 / 1000), "1068.39 MiB");
  EXPECT_EQ(format_mib(int64_t{64} << 30), "65536.00 MiB");
}

TEST(FormatTest, GibHasTwoDecimals) {
  EXPECT_EQ(format_gib(0), "0.00 GiB");
  EXPECT_EQ(format_gib(int64_t{1} << 30), "1.00 GiB");
  EXPECT_EQ(format_gib(int64_t{768} << 20), "0.75 GiB");
  EXPECT_EQ(format_gib(int64_t{141} << 30), "141.00 GiB");
  EXPECT_EQ(format_gib(-(int64_t{1} << 29)), "-0.50 GiB");
}

TEST(FormatTest, LargestCountFits) {
  EXPECT_EQ(format_gib(std::numeric_limits<int64_t>::max()), "8589934592.00 GiB");
  EXPECT_EQ(format_mib(std::numeric_limits<int64_t>::max()), "8796093022208.00 MiB");
}

}  // namespace
}  // namespace st
