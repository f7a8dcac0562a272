#include "shardtrain/kernels/rmsnorm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "grad_check.h"
#include "maximum_check.h"

namespace st {
namespace {

using testing::max_rel_diff;
using testing::numeric_grad;
using testing::randn;
using testing::weighted_sum;

constexpr float kEps = 1e-5f;  // Llama 3's rms_norm_eps

struct Naive {
  std::vector<double> out, rstd, dinp, dweight;
};

// Straight from the definition (Hugging Face's LlamaRMSNorm), in double.
Naive naive_rmsnorm(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& dout, int64_t N,
                    int C) {
  Naive r;
  r.out.resize(N * C);
  r.dinp.resize(N * C);
  r.rstd.resize(N);
  r.dweight.assign(C, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += static_cast<double>(x[n * C + c]) * x[n * C + c];
    const double rs = 1.0 / std::sqrt(ms / C + kEps);
    r.rstd[n] = rs;
    double dot = 0;  // sum_j dy_j w_j x_j
    for (int c = 0; c < C; ++c) {
      r.out[n * C + c] = x[n * C + c] * rs * w[c];
      r.dweight[c] += x[n * C + c] * rs * dout[n * C + c];
      dot += static_cast<double>(dout[n * C + c]) * w[c] * x[n * C + c];
    }
    // d/dx_c of x_c * rs * w_c summed against dy: rs * w_c dy_c - x_c * rs^3 * dot / C.
    for (int c = 0; c < C; ++c) r.dinp[n * C + c] = rs * w[c] * dout[n * C + c] - x[n * C + c] * rs * rs * rs * dot / C;
  }
  return r;
}

struct Fixture {
  int64_t N;
  int C;
  std::vector<float> x, w, dout;
  Fixture(int64_t n, int c, uint64_t stream) : N(n), C(c) {
    x = randn(N * C, stream, 1.5f);
    for (int64_t i = 0; i < N * C; ++i) x[i] += 0.3f;  // rows with a nonzero mean: RMSNorm does not remove it
    w = randn(C, stream + 1, 0.5f);
    for (float& v : w) v += 1.0f;
    dout = randn(N * C, stream + 2);
  }
};

TEST(RmsNorm, HandWorkedRow) {
  // x = [3, 4], eps = 0: mean(x^2) = 12.5, rstd = 1/sqrt(12.5); out = [3, 4] * rstd * [1, 2].
  const std::vector<float> x = {3.0f, 4.0f}, w = {1.0f, 2.0f};
  std::vector<float> out(2), rstd(1);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), 0.0f, 1, 2);
  EXPECT_FLOAT_EQ(rstd[0], static_cast<float>(1.0 / std::sqrt(12.5)));
  EXPECT_FLOAT_EQ(out[0], static_cast<float>(3.0 / std::sqrt(12.5)));
  EXPECT_FLOAT_EQ(out[1], static_cast<float>(8.0 / std::sqrt(12.5)));
}

TEST(RmsNorm, ForwardMatchesNaiveDouble) {
  Fixture f(7, 13, 200);
  std::vector<float> out(f.N * f.C), rstd(f.N);
  rmsnorm_forward(out.data(), rstd.data(), f.x.data(), f.w.data(), kEps, f.N, f.C);
  const Naive r = naive_rmsnorm(f.x, f.w, f.dout, f.N, f.C);
  EXPECT_LE(max_rel_diff(out, r.out), testing::kRefTol);
  EXPECT_LE(max_rel_diff(rstd, r.rstd), testing::kRefTol);
}

TEST(RmsNorm, BackwardMatchesNaiveDouble) {
  Fixture f(7, 13, 210);
  std::vector<float> out(f.N * f.C), rstd(f.N);
  rmsnorm_forward(out.data(), rstd.data(), f.x.data(), f.w.data(), kEps, f.N, f.C);
  std::vector<float> dinp(f.N * f.C, 0.0f), dw(f.C, 0.0f);
  rmsnorm_backward(dinp.data(), dw.data(), f.dout.data(), f.x.data(), f.w.data(), rstd.data(), f.N, f.C);
  const Naive r = naive_rmsnorm(f.x, f.w, f.dout, f.N, f.C);
  EXPECT_LE(max_rel_diff(dinp, r.dinp), testing::kRefTol);
  EXPECT_LE(max_rel_diff(dw, r.dweight), testing::kRefTol);
}

TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  Fixture f(5, 11, 220);
  const std::vector<float>& R = f.dout;  // L = sum(out * R), so dL/dout = R
  std::vector<float> out(f.N * f.C), rstd(f.N);
  auto loss = [&] {
    rmsnorm_forward(out.data(), rstd.data(), f.x.data(), f.w.data(), kEps, f.N, f.C);
    return weighted_sum(out.data(), R);
  };
  loss();
  std::vector<float> dinp(f.N * f.C, 0.0f), dw(f.C, 0.0f);
  rmsnorm_backward(dinp.data(), dw.data(), R.data(), f.x.data(), f.w.data(), rstd.data(), f.N, f.C);
  const auto fd_x = numeric_grad(f.x.data(), f.N * f.C, testing::kFdStep, loss);
  const auto fd_w = numeric_grad(f.w.data(), f.C, testing::kFdStep, loss);
  ASSERT_GT(testing::max_abs(fd_x), 0.1);
  EXPECT_LE(max_rel_diff(dinp, fd_x), testing::kFdTol);
  EXPECT_LE(max_rel_diff(dw, fd_w), testing::kFdTol);
}

// kAccumulate adds to both gradients; kOverwrite writes dweight whatever it held and still adds to dinp (the
// residual stream's gradient).
TEST(RmsNorm, BackwardAccumulatesOrOverwritesParams) {
  Fixture f(6, 10, 230);
  std::vector<float> out(f.N * f.C), rstd(f.N);
  rmsnorm_forward(out.data(), rstd.data(), f.x.data(), f.w.data(), kEps, f.N, f.C);
  std::vector<float> dinp(f.N * f.C, 0.0f), dw(f.C, 0.0f);
  rmsnorm_backward(dinp.data(), dw.data(), f.dout.data(), f.x.data(), f.w.data(), rstd.data(), f.N, f.C);
  const std::vector<float> once_x = dinp, once_w = dw;
  rmsnorm_backward(dinp.data(), dw.data(), f.dout.data(), f.x.data(), f.w.data(), rstd.data(), f.N, f.C);
  for (size_t i = 0; i < dinp.size(); ++i) EXPECT_EQ(dinp[i], 2 * once_x[i]) << i;  // g + g is exact in float
  for (int c = 0; c < f.C; ++c) EXPECT_EQ(dw[c], 2 * once_w[c]) << c;

  std::vector<float> dinp2 = once_x, dw2(f.C, std::nanf(""));
  rmsnorm_backward(dinp2.data(), dw2.data(), f.dout.data(), f.x.data(), f.w.data(), rstd.data(), f.N, f.C,
                   GradWrite::kOverwrite);
  EXPECT_EQ(0, std::memcmp(dinp2.data(), dinp.data(), dinp.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dw2.data(), once_w.data(), once_w.size() * sizeof(float)));
}

// amax: the tensorwise maximum fp8_maxima takes of the tensor written (the forward's out, the backward's dinp as
// accumulated), folded into what *amax held (a larger value stays); the outputs keep the bits of a run without it.
TEST(RmsNorm, AmaxIsTheMaximumOfWhatItWrites) {
  Fixture f(37, 24, 250);
  std::vector<float> plain(f.N * f.C), plain_rstd(f.N), out(f.N * f.C), rstd(f.N);
  rmsnorm_forward(plain.data(), plain_rstd.data(), f.x.data(), f.w.data(), kEps, f.N, f.C);
  unsigned amax = 0;
  rmsnorm_forward(out.data(), rstd.data(), f.x.data(), f.w.data(), kEps, f.N, f.C, &amax);
  EXPECT_EQ(0, std::memcmp(out.data(), plain.data(), out.size() * sizeof(float)));
  EXPECT_EQ(amax, testing::tensor_maximum(out));
  EXPECT_GT(amax, 0u);
  unsigned above = testing::maximum_bits(1e30f);
  rmsnorm_forward(out.data(), rstd.data(), f.x.data(), f.w.data(), kEps, f.N, f.C, &above);
  EXPECT_EQ(above, testing::maximum_bits(1e30f));

  const std::vector<float> dinp0 = randn(f.N * f.C, 251);
  std::vector<float> dinp_plain = dinp0, dinp = dinp0;
  rmsnorm_backward(dinp_plain.data(), nullptr, f.dout.data(), f.x.data(), f.w.data(), rstd.data(), f.N, f.C);
  unsigned damax = 0;
  rmsnorm_backward(dinp.data(), nullptr, f.dout.data(), f.x.data(), f.w.data(), rstd.data(), f.N, f.C,
                   GradWrite::kOverwrite, &damax);
  EXPECT_EQ(0, std::memcmp(dinp.data(), dinp_plain.data(), dinp.size() * sizeof(float)));
  EXPECT_EQ(damax, testing::tensor_maximum(dinp));
}

// rmsnorm_forward_fp8: rstd as rmsnorm_forward saves it, and the codes, inverse scale and maximum of casting its out
// with the given maximum (a smaller one saturates, a zero one scales by 1), and its transposed codes alone.
TEST(RmsNorm, Fp8CastsTheOutputItDoesNotStore) {
  Fixture x(9, 40, 260);
  std::vector<float> out(x.N * x.C), rstd(x.N), fused_rstd(x.N);
  rmsnorm_forward(out.data(), rstd.data(), x.x.data(), x.w.data(), kEps, x.N, x.C);
  float m = 0.0f;
  const unsigned out_max = testing::tensor_maximum(out);
  std::memcpy(&m, &out_max, sizeof(m));
  testing::expect_cast_ahead(out, x.N, x.C, {m, m / 4, 0.0f},
                             [&](uint8_t* q, uint8_t* q_t, float* inv, unsigned* own, Fp8Format f, const unsigned* a) {
                               std::fill(fused_rstd.begin(), fused_rstd.end(), -1.0f);
                               rmsnorm_forward_fp8(q, q_t, inv, own, fused_rstd.data(), x.x.data(), x.w.data(), kEps,
                                                   x.N, x.C, f, a);
                               EXPECT_EQ(0, std::memcmp(fused_rstd.data(), rstd.data(), rstd.size() * sizeof(float)));
                             });
}

TEST(RmsNorm, BackwardDeterministicAcrossThreadCounts) {
  // Many rows and several column blocks, above the size below which the kernels stay serial.
  Fixture f(601, 77, 240);
  std::vector<float> out(f.N * f.C), rstd(f.N);
  rmsnorm_forward(out.data(), rstd.data(), f.x.data(), f.w.data(), kEps, f.N, f.C);
  testing::expect_same_bits_across_thread_counts([&] {
    std::vector<float> g(f.N * f.C + f.C, 0.0f);
    rmsnorm_backward(g.data(), g.data() + f.N * f.C, f.dout.data(), f.x.data(), f.w.data(), rstd.data(), f.N, f.C);
    return g;
  });
}

}  // namespace
}  // namespace st
