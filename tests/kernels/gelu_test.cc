#include "shardtrain/kernels/gelu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "grad_check.h"
#include "maximum_check.h"

namespace st {
namespace {

using testing::max_rel_diff;
using testing::numeric_grad;
using testing::randn;
using testing::weighted_sum;

double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double gelu_grad_ref(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  const double u = k * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

TEST(Gelu, ForwardMatchesNaiveDouble) {
  const int64_t n = 1037;
  auto x = randn(n, 300, 3.0f);
  std::vector<float> out(n);
  gelu_forward(out.data(), x.data(), n);
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = gelu_ref(x[i]);
  EXPECT_LE(max_rel_diff(out, ref), testing::kRefTol);
}

// amax: the tensorwise maximum fp8_maxima takes of out, folded into what *amax held; out keeps the bits of a run
// without it.
TEST(Gelu, ForwardAmaxIsTheMaximumOfItsOutput) {
  const int64_t n = 1037;
  const std::vector<float> x = randn(n, 305, 3.0f);
  std::vector<float> plain(n), out(n);
  gelu_forward(plain.data(), x.data(), n);
  unsigned amax = 0;
  gelu_forward(out.data(), x.data(), n, &amax);
  EXPECT_EQ(out, plain);
  EXPECT_EQ(amax, testing::tensor_maximum(out));
  unsigned above = testing::maximum_bits(1e30f);
  gelu_forward(out.data(), x.data(), n, &above);
  EXPECT_EQ(above, testing::maximum_bits(1e30f));
}

TEST(Gelu, KnownValues) {
  // The tanh formula evaluated in double (Python math); saturates to x and 0 far from the origin.
  const std::vector<float> x = {0.0f, 1.0f, -1.0f, 3.0f, 20.0f, -20.0f};
  const std::vector<double> want = {0.0, 0.8411919906082768, -0.15880800939172324, 2.996362607918227, 20.0, 0.0};
  std::vector<float> out(x.size());
  gelu_forward(out.data(), x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-6) << "x = " << x[i];
}

TEST(Gelu, BackwardMatchesNaiveDouble) {
  const int64_t n = 517;
  auto x = randn(n, 310, 3.0f);
  auto dout = randn(n, 311);
  std::vector<float> dinp(n, 0.0f);
  gelu_backward(dinp.data(), x.data(), dout.data(), n);
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = gelu_grad_ref(x[i]) * dout[i];
  EXPECT_LE(max_rel_diff(dinp, ref), testing::kRefTol);
}

TEST(Gelu, BackwardMatchesFiniteDifferences) {
  const int64_t n = 61;
  auto x = randn(n, 320, 2.0f);
  const auto R = randn(n, 321);
  std::vector<float> out(n);
  auto loss = [&] {
    gelu_forward(out.data(), x.data(), n);
    return weighted_sum(out.data(), R);
  };
  std::vector<float> dinp(n, 0.0f);
  gelu_backward(dinp.data(), x.data(), R.data(), n);
  const auto fd = numeric_grad(x.data(), n, testing::kFdStep, loss);
  ASSERT_GT(testing::max_abs(fd), 0.1);
  EXPECT_LE(max_rel_diff(dinp, fd), testing::kFdTol);
}

TEST(Gelu, BackwardAccumulates) {
  const int64_t n = 97;
  auto x = randn(n, 330, 2.0f);
  auto dout = randn(n, 331);
  auto g0 = randn(n, 332);
  std::vector<float> once(n, 0.0f);
  gelu_backward(once.data(), x.data(), dout.data(), n);
  auto acc = g0;
  gelu_backward(acc.data(), x.data(), dout.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(acc[i], g0[i] + once[i]) << i;
}

// kOverwrite ignores what dinp held (NaNs included) and may run in place on dout.
TEST(Gelu, BackwardOverwritesAndRunsInPlace) {
  const int64_t n = 97;
  auto x = randn(n, 333, 2.0f);
  auto dout = randn(n, 334);
  std::vector<float> want(n, 0.0f);
  gelu_backward(want.data(), x.data(), dout.data(), n);
  std::vector<float> fresh(n, std::numeric_limits<float>::quiet_NaN());
  gelu_backward(fresh.data(), x.data(), dout.data(), n, GradWrite::kOverwrite);
  auto inplace = dout;
  gelu_backward(inplace.data(), x.data(), inplace.data(), n, GradWrite::kOverwrite);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(fresh[i], want[i]) << i;
    EXPECT_EQ(inplace[i], want[i]) << i;
  }
}

TEST(Residual, AddsAndAllowsAliasing) {
  const int64_t n = 77;
  const auto a = randn(n, 340), b = randn(n, 341);
  std::vector<float> out(n);
  residual_forward(out.data(), a.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(out[i], a[i] + b[i]) << i;
  auto a2 = a;
  residual_forward(a2.data(), a2.data(), b.data(), n);  // out aliases a
  EXPECT_EQ(a2, out);
  auto b2 = b;
  residual_forward(b2.data(), a.data(), b2.data(), n);  // out aliases b
  EXPECT_EQ(b2, out);
}

}  // namespace
}  // namespace st
