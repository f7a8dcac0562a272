// exp_fast is private to src/kernels, hence the relative include.
#include "../../src/kernels/vec_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace st::kernels_internal {
namespace {

// Relative error against double exp on every 1021st float of [-87, 88] (~2M points, walked on the bit
// patterns; the full range, every float, measured 1.37 ulp = 8.2e-8 at worst). 2 ulp = 1.2e-7 is what the
// kernels rely on: it is below the float rounding of the sums they feed.
TEST(ExpFast, RelativeErrorBelowTwoUlpOnItsRange) {
  const ExpRange er = exp_range();
  double worst = 0;
  float worst_x = 0;
  auto check = [&](uint32_t bits) {
    float x;
    std::memcpy(&x, &bits, sizeof(x));
    const double ref = std::exp(static_cast<double>(x));
    const double err = std::abs(exp_fast(x, er) - ref) / ref;
    if (err > worst) worst = err, worst_x = x;
  };
  constexpr uint32_t kStride = 1021;
  for (uint32_t b = 0x80000000u; b <= 0xC2AE0000u; b += kStride) check(b);  // [-87, -0]
  for (uint32_t b = 0; b <= 0x42B00000u; b += kStride) check(b);            // [0, 88]
  check(0xC2AE0000u);
  check(0x42B00000u);
  EXPECT_LE(worst, 2 * 5.96e-8) << "at x = " << worst_x;
}

TEST(ExpFast, ExactPointsAndClamping) {
  const ExpRange er = exp_range();
  EXPECT_EQ(exp_fast(0.0f, er), 1.0f);
  EXPECT_NEAR(exp_fast(1.0f, er), std::exp(1.0), 2e-7 * std::exp(1.0));
  // Below the range: e^-87 (~1.6e-38), not 0, not garbage; never negative or NaN.
  for (float x : {-87.5f, -100.0f, -1e6f, -std::numeric_limits<float>::infinity()}) {
    EXPECT_NEAR(exp_fast(x, er), std::exp(-87.0), 1e-44) << x;
  }
  for (float x : {89.0f, 1e6f, std::numeric_limits<float>::infinity()}) {
    EXPECT_NEAR(exp_fast(x, er), std::exp(88.0), 1e31) << x;
  }
  EXPECT_TRUE(std::isnan(exp_fast(std::numeric_limits<float>::quiet_NaN(), er)));
}

}  // namespace
}  // namespace st::kernels_internal
