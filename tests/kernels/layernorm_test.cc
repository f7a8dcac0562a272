#include "shardtrain/kernels/layernorm.h"

#include <gtest/gtest.h>

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

struct Naive {
  std::vector<double> out, mean, rstd, dinp, dweight, dbias;
};

// Straight from the definition, in double.
Naive naive_layernorm(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b,
                      const std::vector<float>& dout, int64_t N, int C) {
  Naive r;
  r.out.resize(N * C);
  r.dinp.resize(N * C);
  r.mean.resize(N);
  r.rstd.resize(N);
  r.dweight.assign(C, 0.0);
  r.dbias.assign(C, 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    const double rs = 1.0 / std::sqrt(v + 1e-5);
    r.mean[n] = m;
    r.rstd[n] = rs;
    double a = 0, bsum = 0;  // mean of dxhat and of dxhat*xhat
    for (int c = 0; c < C; ++c) {
      const double xh = (x[n * C + c] - m) * rs;
      const double dxh = static_cast<double>(w[c]) * dout[n * C + c];
      r.out[n * C + c] = xh * w[c] + b[c];
      r.dweight[c] += xh * dout[n * C + c];
      r.dbias[c] += dout[n * C + c];
      a += dxh;
      bsum += dxh * xh;
    }
    a /= C;
    bsum /= C;
    for (int c = 0; c < C; ++c) {
      const double xh = (x[n * C + c] - m) * rs;
      const double dxh = static_cast<double>(w[c]) * dout[n * C + c];
      r.dinp[n * C + c] = rs * (dxh - a - xh * bsum);
    }
  }
  return r;
}

struct Fixture {
  int64_t N;
  int C;
  std::vector<float> x, w, b, dout;
  Fixture(int64_t n, int c, uint64_t stream) : N(n), C(c) {
    x = randn(N * C, stream, 1.5f);
    for (int64_t i = 0; i < N * C; ++i) x[i] += 0.3f;  // rows with a nonzero mean
    w = randn(C, stream + 1, 0.5f);
    for (float& v : w) v += 1.0f;
    b = randn(C, stream + 2, 0.2f);
    dout = randn(N * C, stream + 3);
  }
};

TEST(LayerNorm, ForwardMatchesNaiveDouble) {
  Fixture f(7, 13, 100);
  std::vector<float> out(f.N * f.C), mean(f.N), rstd(f.N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), f.x.data(), f.w.data(), f.b.data(), f.N, f.C);
  const Naive r = naive_layernorm(f.x, f.w, f.b, f.dout, f.N, f.C);
  EXPECT_LE(max_rel_diff(out, r.out), testing::kRefTol);
  EXPECT_LE(max_rel_diff(mean, r.mean), testing::kRefTol);
  EXPECT_LE(max_rel_diff(rstd, r.rstd), testing::kRefTol);
}

// amax: the tensorwise maximum fp8_maxima takes of out, folded into what *amax held; out keeps the bits of a run
// without it.
TEST(LayerNorm, ForwardAmaxIsTheMaximumOfItsOutput) {
  Fixture f(19, 40, 105);
  std::vector<float> plain(f.N * f.C), out(f.N * f.C), mean(f.N), rstd(f.N);
  layernorm_forward(plain.data(), mean.data(), rstd.data(), f.x.data(), f.w.data(), f.b.data(), f.N, f.C);
  unsigned amax = 0;
  layernorm_forward(out.data(), mean.data(), rstd.data(), f.x.data(), f.w.data(), f.b.data(), f.N, f.C, &amax);
  EXPECT_EQ(0, std::memcmp(out.data(), plain.data(), out.size() * sizeof(float)));
  EXPECT_EQ(amax, testing::tensor_maximum(out));
  unsigned above = testing::maximum_bits(1e30f);
  layernorm_forward(out.data(), mean.data(), rstd.data(), f.x.data(), f.w.data(), f.b.data(), f.N, f.C, &above);
  EXPECT_EQ(above, testing::maximum_bits(1e30f));
}

TEST(LayerNorm, ConstantRowGivesBias) {
  // var = 0: rstd = 1/sqrt(eps) and out = bias exactly (x - mean = 0).
  const int C = 9;
  std::vector<float> x(2 * C, 3.25f), w(C, 2.0f), b(C), out(2 * C), mean(2), rstd(2);
  for (int c = 0; c < C; ++c) b[c] = 0.1f * c;
  layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), 2, C);
  for (int i = 0; i < 2 * C; ++i) EXPECT_EQ(out[i], b[i % C]) << i;
  EXPECT_EQ(mean[0], 3.25f);
  EXPECT_NEAR(rstd[0], 1.0 / std::sqrt(1e-5), 1e-2);
}

TEST(LayerNorm, BackwardMatchesNaiveDouble) {
  Fixture f(7, 13, 110);
  std::vector<float> out(f.N * f.C), mean(f.N), rstd(f.N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), f.x.data(), f.w.data(), f.b.data(), f.N, f.C);
  std::vector<float> dinp(f.N * f.C, 0.0f), dw(f.C, 0.0f), db(f.C, 0.0f);
  layernorm_backward(dinp.data(), dw.data(), db.data(), f.dout.data(), f.x.data(), f.w.data(), mean.data(), rstd.data(),
                     f.N, f.C);
  const Naive r = naive_layernorm(f.x, f.w, f.b, f.dout, f.N, f.C);
  EXPECT_LE(max_rel_diff(dinp, r.dinp), testing::kRefTol);
  EXPECT_LE(max_rel_diff(dw, r.dweight), testing::kRefTol);
  EXPECT_LE(max_rel_diff(db, r.dbias), testing::kRefTol);
}

TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  Fixture f(5, 11, 120);
  const std::vector<float>& R = f.dout;  // L = sum(out * R), so dL/dout = R
  std::vector<float> out(f.N * f.C), mean(f.N), rstd(f.N);
  auto loss = [&] {
    layernorm_forward(out.data(), mean.data(), rstd.data(), f.x.data(), f.w.data(), f.b.data(), f.N, f.C);
    return weighted_sum(out.data(), R);
  };
  loss();
  std::vector<float> dinp(f.N * f.C, 0.0f), dw(f.C, 0.0f), db(f.C, 0.0f);
  layernorm_backward(dinp.data(), dw.data(), db.data(), R.data(), f.x.data(), f.w.data(), mean.data(), rstd.data(), f.N,
                     f.C);
  const auto fd_x = numeric_grad(f.x.data(), f.N * f.C, testing::kFdStep, loss);
  const auto fd_w = numeric_grad(f.w.data(), f.C, testing::kFdStep, loss);
  const auto fd_b = numeric_grad(f.b.data(), f.C, testing::kFdStep, loss);
  ASSERT_GT(testing::max_abs(fd_x), 0.1);
  EXPECT_LE(max_rel_diff(dinp, fd_x), testing::kFdTol);
  EXPECT_LE(max_rel_diff(dw, fd_w), testing::kFdTol);
  EXPECT_LE(max_rel_diff(db, fd_b), testing::kFdTol);
}

TEST(LayerNorm, BackwardAccumulates) {
  Fixture f(6, 10, 130);
  std::vector<float> out(f.N * f.C), mean(f.N), rstd(f.N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), f.x.data(), f.w.data(), f.b.data(), f.N, f.C);
  std::vector<float> dinp(f.N * f.C, 0.0f), dw(f.C, 0.0f), db(f.C, 0.0f);
  auto backward = [&] {
    layernorm_backward(dinp.data(), dw.data(), db.data(), f.dout.data(), f.x.data(), f.w.data(), mean.data(),
                       rstd.data(), f.N, f.C);
  };
  backward();
  const auto once_x = testing::to_double(dinp), once_w = testing::to_double(dw), once_b = testing::to_double(db);
  backward();
  // g + g is exact in float: the second call must add, not overwrite.
  for (size_t i = 0; i < dinp.size(); ++i) EXPECT_EQ(dinp[i], 2 * static_cast<float>(once_x[i])) << i;
  for (int c = 0; c < f.C; ++c) {
    EXPECT_EQ(dw[c], 2 * static_cast<float>(once_w[c])) << c;
    EXPECT_EQ(db[c], 2 * static_cast<float>(once_b[c])) << c;
  }
}

// param_write = kOverwrite: dweight and dbias get what adding to zeroed ones gives, whatever they held; dinp still
// accumulates (it is the residual stream's gradient).
TEST(LayerNorm, BackwardOverwritesParamsOnRequest) {
  Fixture f(6, 10, 131);
  std::vector<float> out(f.N * f.C), mean(f.N), rstd(f.N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), f.x.data(), f.w.data(), f.b.data(), f.N, f.C);
  const std::vector<float> dinp0 = randn(f.N * f.C, 132);
  std::vector<float> dinp = dinp0, dw(f.C, 0.0f), db(f.C, 0.0f);
  layernorm_backward(dinp.data(), dw.data(), db.data(), f.dout.data(), f.x.data(), f.w.data(), mean.data(), rstd.data(),
                     f.N, f.C);
  std::vector<float> dinp2 = dinp0, dw2(f.C, std::nanf("")), db2(f.C, std::nanf(""));
  layernorm_backward(dinp2.data(), dw2.data(), db2.data(), f.dout.data(), f.x.data(), f.w.data(), mean.data(),
                     rstd.data(), f.N, f.C, GradWrite::kOverwrite);
  EXPECT_EQ(0, std::memcmp(dinp2.data(), dinp.data(), dinp.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dw2.data(), dw.data(), dw.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(db2.data(), db.data(), db.size() * sizeof(float)));
}

TEST(LayerNorm, BackwardDeterministicAcrossThreadCounts) {
  // Many rows and several column blocks, so a row-parallel reduction would reorder sums; N*C is well
  // above the size below which the kernels stay serial (src/kernels/parallel.h).
  Fixture f(601, 77, 140);
  std::vector<float> out(f.N * f.C), mean(f.N), rstd(f.N);
  layernorm_forward(out.data(), mean.data(), rstd.data(), f.x.data(), f.w.data(), f.b.data(), f.N, f.C);
  testing::expect_same_bits_across_thread_counts([&] {
    std::vector<float> g(f.N * f.C + 2 * f.C, 0.0f);
    layernorm_backward(g.data(), g.data() + f.N * f.C, g.data() + f.N * f.C + f.C, f.dout.data(), f.x.data(),
                       f.w.data(), mean.data(), rstd.data(), f.N, f.C);
    return g;
  });
}

}  // namespace
}  // namespace st
