// st::fill_uniform, the CPU reference of gpu::fill_uniform: values in [-1, 1), a function of (seed, index) alone, and
// spread like a uniform distribution (the GEMM tuning times cuBLASLt on them; constant operands flatter the kernels).
#include "shardtrain/kernels/fill.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace st {
namespace {

TEST(FillUniform, ValuesAreUniformInMinusOneToOne) {
  constexpr int64_t n = 100000;
  std::vector<float> v(n);
  fill_uniform(v.data(), n, 7);
  double sum = 0, sq = 0;
  for (float x : v) {
    ASSERT_GE(x, -1.0f);
    ASSERT_LT(x, 1.0f);
    sum += x;
    sq += static_cast<double>(x) * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);       // mean 0; the standard error is 0.0018
  EXPECT_NEAR(sq / n, 1.0 / 3.0, 0.01);  // variance 1/3
  std::sort(v.begin(), v.end());
  EXPECT_GT(std::unique(v.begin(), v.end()) - v.begin(), n * 99 / 100);  // 2^24 levels: few repeats
}

TEST(FillUniform, IsAFunctionOfSeedAndIndex) {
  std::vector<float> a(64), b(64), prefix(10), other(64);
  fill_uniform(a.data(), 64, 1);
  fill_uniform(b.data(), 64, 1);
  fill_uniform(prefix.data(), 10, 1);
  fill_uniform(other.data(), 64, 2);
  EXPECT_EQ(a, b);
  EXPECT_TRUE(std::equal(prefix.begin(), prefix.end(), a.begin()));
  EXPECT_NE(a, other);
}

}  // namespace
}  // namespace st
