#include "shardtrain/kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "grad_check.h"
#include "shardtrain/kernels/gelu.h"

namespace st {
namespace {

using testing::max_rel_diff;
using testing::numeric_grad;
using testing::randn;
using testing::weighted_sum;

struct Case {
  int64_t N;
  int C, OC;
  std::vector<float> inp, w, b, dout;
  Case(int64_t n, int c, int oc, uint64_t stream) : N(n), C(c), OC(oc) {
    inp = randn(N * C, stream);
    w = randn(static_cast<int64_t>(OC) * C, stream + 1, 0.3f);
    b = randn(OC, stream + 2);
    dout = randn(N * OC, stream + 3);
  }
};

std::vector<double> naive_forward(const Case& k, bool with_bias) {
  std::vector<double> out(k.N * k.OC);
  for (int64_t n = 0; n < k.N; ++n)
    for (int o = 0; o < k.OC; ++o) {
      double s = with_bias ? k.b[o] : 0.0;
      for (int c = 0; c < k.C; ++c) s += static_cast<double>(k.inp[n * k.C + c]) * k.w[o * k.C + c];
      out[n * k.OC + o] = s;
    }
  return out;
}

TEST(Matmul, ForwardMatchesNaiveDouble) {
  Case k(7, 9, 5, 200);
  std::vector<float> out(k.N * k.OC);
  matmul_forward(out.data(), k.inp.data(), k.w.data(), k.b.data(), k.N, k.C, k.OC);
  EXPECT_LE(max_rel_diff(out, naive_forward(k, true)), testing::kRefTol);
}

TEST(Matmul, ForwardWithoutBiasOverwritesOutput) {
  Case k(13, 33, 17, 210);
  std::vector<float> out(k.N * k.OC, 1e6f);  // stale contents must not leak in
  matmul_forward(out.data(), k.inp.data(), k.w.data(), nullptr, k.N, k.C, k.OC);
  EXPECT_LE(max_rel_diff(out, naive_forward(k, false)), testing::kRefTol);
}

TEST(Matmul, ForwardLargerShapeMatchesNaive) {
  // Big enough for OpenBLAS to use its threaded and packed paths, with tails in every dimension.
  Case k(131, 97, 67, 220);
  std::vector<float> out(k.N * k.OC, -3.0f);
  matmul_forward(out.data(), k.inp.data(), k.w.data(), k.b.data(), k.N, k.C, k.OC);
  EXPECT_LE(max_rel_diff(out, naive_forward(k, true)), testing::kRefTol);
}

// residual + product + bias, into a separate output and in place over the residual, with and without bias.
TEST(Matmul, ForwardResidualMatchesNaiveDouble) {
  Case k(131, 97, 67, 225);
  const std::vector<float> residual = randn(k.N * k.OC, 229);
  for (bool with_bias : {true, false}) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "bias=" << with_bias << " in_place=" << in_place);
      std::vector<double> want = naive_forward(k, with_bias);
      for (size_t i = 0; i < want.size(); ++i) want[i] += residual[i];
      std::vector<float> out = in_place ? residual : std::vector<float>(k.N * k.OC, 1e6f);
      matmul_forward_residual(out.data(), k.inp.data(), k.w.data(), with_bias ? k.b.data() : nullptr,
                              in_place ? out.data() : residual.data(), k.N, k.C, k.OC);
      EXPECT_LE(max_rel_diff(out, want), testing::kRefTol);
    }
  }
}

// A SwiGLU block's down projection: residual + swiglu(gate_up) @ w^T + bias in place over the residual, and the SwiGLU
// left in mlp, against double: silu(g) u = g u / (1 + exp(-g)).
TEST(Matmul, SwigluForwardResidualMatchesNaiveDouble) {
  const int64_t N = 5;
  const int F = 37, OC = 23;
  const std::vector<float> gate_up = randn(N * 2 * F, 231, 2.0f), w = randn(int64_t{OC} * F, 232, 0.3f);
  const std::vector<float> b = randn(OC, 233), residual = randn(N * OC, 234);
  std::vector<double> mlp_want(N * F), want(N * OC);
  for (int64_t n = 0; n < N; ++n)
    for (int f = 0; f < F; ++f) {
      const double g = gate_up[n * 2 * F + f], u = gate_up[n * 2 * F + F + f];
      mlp_want[n * F + f] = g * u / (1.0 + std::exp(-g));
    }
  for (int64_t n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = residual[n * OC + o] + b[o];
      for (int f = 0; f < F; ++f) s += mlp_want[n * F + f] * w[o * F + f];
      want[n * OC + o] = s;
    }
  std::vector<float> out = residual, mlp(N * F, 1e6f);
  swiglu_matmul_forward_residual(out.data(), mlp.data(), gate_up.data(), w.data(), b.data(), out.data(), N, F, OC);
  EXPECT_LE(max_rel_diff(mlp, mlp_want), testing::kRefTol);
  EXPECT_LE(max_rel_diff(out, want), testing::kRefTol);
}

TEST(Matmul, BackwardMatchesNaiveDouble) {
  Case k(11, 9, 5, 230);
  std::vector<float> dinp(k.N * k.C, 0.0f), dw(k.OC * k.C, 0.0f), db(k.OC, 0.0f);
  matmul_backward(dinp.data(), dw.data(), db.data(), k.dout.data(), k.inp.data(), k.w.data(), k.N, k.C, k.OC);
  std::vector<double> rdinp(k.N * k.C, 0.0), rdw(k.OC * k.C, 0.0), rdb(k.OC, 0.0);
  for (int64_t n = 0; n < k.N; ++n)
    for (int o = 0; o < k.OC; ++o) {
      const double d = k.dout[n * k.OC + o];
      rdb[o] += d;
      for (int c = 0; c < k.C; ++c) {
        rdinp[n * k.C + c] += d * k.w[o * k.C + c];
        rdw[o * k.C + c] += d * k.inp[n * k.C + c];
      }
    }
  EXPECT_LE(max_rel_diff(dinp, rdinp), testing::kRefTol);
  EXPECT_LE(max_rel_diff(dw, rdw), testing::kRefTol);
  EXPECT_LE(max_rel_diff(db, rdb), testing::kRefTol);
}

TEST(Matmul, BackwardMatchesFiniteDifferences) {
  Case k(7, 9, 5, 240);
  const std::vector<float>& R = k.dout;
  std::vector<float> out(k.N * k.OC);
  auto loss = [&] {
    matmul_forward(out.data(), k.inp.data(), k.w.data(), k.b.data(), k.N, k.C, k.OC);
    return weighted_sum(out.data(), R);
  };
  std::vector<float> dinp(k.N * k.C, 0.0f), dw(k.OC * k.C, 0.0f), db(k.OC, 0.0f);
  matmul_backward(dinp.data(), dw.data(), db.data(), R.data(), k.inp.data(), k.w.data(), k.N, k.C, k.OC);
  const auto fd_inp = numeric_grad(k.inp.data(), k.N * k.C, testing::kFdStep, loss);
  const auto fd_w = numeric_grad(k.w.data(), k.OC * k.C, testing::kFdStep, loss);
  const auto fd_b = numeric_grad(k.b.data(), k.OC, testing::kFdStep, loss);
  ASSERT_GT(testing::max_abs(fd_w), 0.1);
  EXPECT_LE(max_rel_diff(dinp, fd_inp), testing::kFdTol);
  EXPECT_LE(max_rel_diff(dw, fd_w), testing::kFdTol);
  EXPECT_LE(max_rel_diff(db, fd_b), testing::kFdTol);
}

TEST(Matmul, BackwardAccumulatesIntoExistingGradients) {
  Case k(9, 7, 6, 250);
  std::vector<float> dinp(k.N * k.C, 0.0f), dw(k.OC * k.C, 0.0f), db(k.OC, 0.0f);
  matmul_backward(dinp.data(), dw.data(), db.data(), k.dout.data(), k.inp.data(), k.w.data(), k.N, k.C, k.OC);
  // Start from nonzero gradients G0: the result must be G0 + g.
  auto g0_inp = randn(k.N * k.C, 251), g0_w = randn(k.OC * k.C, 252), g0_b = randn(k.OC, 253);
  auto acc_inp = g0_inp, acc_w = g0_w, acc_b = g0_b;
  matmul_backward(acc_inp.data(), acc_w.data(), acc_b.data(), k.dout.data(), k.inp.data(), k.w.data(), k.N, k.C, k.OC);
  auto expect_sum = [](const std::vector<float>& got, const std::vector<float>& a, const std::vector<float>& b) {
    std::vector<double> ref(a.size());
    for (size_t i = 0; i < a.size(); ++i) ref[i] = static_cast<double>(a[i]) + b[i];
    EXPECT_LE(max_rel_diff(got, ref), 1e-6);
  };
  expect_sum(acc_inp, g0_inp, dinp);
  expect_sum(acc_w, g0_w, dw);
  expect_sum(acc_b, g0_b, db);
  // And a second call on the first result doubles it.
  auto twice_w = dw, twice_b = db;
  matmul_backward(nullptr, twice_w.data(), twice_b.data(), k.dout.data(), k.inp.data(), k.w.data(), k.N, k.C, k.OC);
  expect_sum(twice_w, dw, dw);
  expect_sum(twice_b, db, db);
}

// kOverwrite: dinp = dout @ weight whatever it held before (NaNs included); dweight and dbias still accumulate.
TEST(Matmul, BackwardOverwritesDinpOnRequest) {
  Case k(9, 7, 6, 255);
  std::vector<float> dinp(k.N * k.C, 0.0f), dw(k.OC * k.C, 0.0f), db(k.OC, 0.0f);
  matmul_backward(dinp.data(), dw.data(), db.data(), k.dout.data(), k.inp.data(), k.w.data(), k.N, k.C, k.OC);
  std::vector<float> fresh(k.N * k.C, std::numeric_limits<float>::quiet_NaN());
  auto acc_w = dw, acc_b = db;
  matmul_backward(fresh.data(), acc_w.data(), acc_b.data(), k.dout.data(), k.inp.data(), k.w.data(), k.N, k.C, k.OC,
                  GradWrite::kOverwrite);
  EXPECT_EQ(0, std::memcmp(fresh.data(), dinp.data(), dinp.size() * sizeof(float)));
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_FLOAT_EQ(acc_w[i], 2 * dw[i]) << i;
  for (size_t i = 0; i < db.size(); ++i) EXPECT_FLOAT_EQ(acc_b[i], 2 * db[i]) << i;
}

// param_write = kOverwrite: dweight and dbias get the bits that adding to zeroed ones gives, whatever they held
// (NaNs included); dinp still follows dinp_write. Also through matmul_backward_gelu.
TEST(Matmul, BackwardOverwritesParamsOnRequest) {
  Case k(9, 7, 6, 257);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> dinp(k.N * k.C, 0.0f), dw(k.OC * k.C, 0.0f), db(k.OC, 0.0f);
  matmul_backward(dinp.data(), dw.data(), db.data(), k.dout.data(), k.inp.data(), k.w.data(), k.N, k.C, k.OC);
  std::vector<float> dinp2(k.N * k.C, 0.0f), dw2(k.OC * k.C, nan), db2(k.OC, nan);
  matmul_backward(dinp2.data(), dw2.data(), db2.data(), k.dout.data(), k.inp.data(), k.w.data(), k.N, k.C, k.OC,
                  GradWrite::kAccumulate, GradWrite::kOverwrite);
  EXPECT_EQ(0, std::memcmp(dinp2.data(), dinp.data(), dinp.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dw2.data(), dw.data(), dw.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(db2.data(), db.data(), db.size() * sizeof(float)));

  const std::vector<float> pre = randn(k.N * k.C, 258);
  std::vector<float> act(pre.size()), g_dinp(pre.size()), g_dw(k.OC * k.C, 0.0f), g_db(k.OC, 0.0f);
  gelu_forward(act.data(), pre.data(), k.N * k.C);
  matmul_backward_gelu(g_dinp.data(), g_dw.data(), g_db.data(), k.dout.data(), act.data(), k.w.data(), pre.data(), k.N,
                       k.C, k.OC);
  std::vector<float> o_dinp(pre.size()), o_dw(k.OC * k.C, nan), o_db(k.OC, nan);
  matmul_backward_gelu(o_dinp.data(), o_dw.data(), o_db.data(), k.dout.data(), act.data(), k.w.data(), pre.data(), k.N,
                       k.C, k.OC, GradWrite::kOverwrite);
  EXPECT_EQ(0, std::memcmp(o_dinp.data(), g_dinp.data(), g_dinp.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(o_dw.data(), g_dw.data(), g_dw.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(o_db.data(), g_db.data(), g_db.size() * sizeof(float)));
}

// The MLP's second layer: out = gelu(pre) @ W^T + b. dinp is d/dpre of L = sum(out * R), by finite differences;
// dweight and dbias accumulate as matmul_backward's.
TEST(Matmul, BackwardGeluMatchesFiniteDifferences) {
  Case k(6, 10, 5, 256);
  const std::vector<float> pre = randn(k.N * k.C, 257, 1.5f);
  std::vector<float> act(pre.size());
  gelu_forward(act.data(), pre.data(), k.N * k.C);
  std::vector<float> dpre(pre.size(), std::numeric_limits<float>::quiet_NaN());  // overwritten, never read
  std::vector<float> dw(k.OC * k.C, 0.0f), db(k.OC, 0.0f), dw_ref = dw, db_ref = db;
  matmul_backward_gelu(dpre.data(), dw.data(), db.data(), k.dout.data(), act.data(), k.w.data(), pre.data(), k.N, k.C,
                       k.OC);
  matmul_backward(nullptr, dw_ref.data(), db_ref.data(), k.dout.data(), act.data(), k.w.data(), k.N, k.C, k.OC);
  EXPECT_EQ(dw, dw_ref);
  EXPECT_EQ(db, db_ref);
  std::vector<float> x = pre, a(x.size()), out(k.N * k.OC);
  auto loss = [&] {
    gelu_forward(a.data(), x.data(), k.N * k.C);
    matmul_forward(out.data(), a.data(), k.w.data(), k.b.data(), k.N, k.C, k.OC);
    return weighted_sum(out.data(), k.dout);
  };
  const auto fd = numeric_grad(x.data(), k.N * k.C, testing::kFdStep, loss);
  ASSERT_GT(testing::max_abs(fd), 0.1);
  EXPECT_LE(max_rel_diff(dpre, fd), testing::kFdTol);
}

TEST(Matmul, BackwardWithNullDinpAndDbias) {
  Case k(8, 6, 4, 260);
  std::vector<float> dinp(k.N * k.C, 0.0f), dw(k.OC * k.C, 0.0f), db(k.OC, 0.0f);
  matmul_backward(dinp.data(), dw.data(), db.data(), k.dout.data(), k.inp.data(), k.w.data(), k.N, k.C, k.OC);
  std::vector<float> dw_only(k.OC * k.C, 0.0f);
  matmul_backward(nullptr, dw_only.data(), nullptr, k.dout.data(), k.inp.data(), k.w.data(), k.N, k.C, k.OC);
  EXPECT_EQ(0, std::memcmp(dw.data(), dw_only.data(), dw.size() * sizeof(float)));
}

TEST(Matmul, DbiasDeterministicAcrossThreadCounts) {
  // N*OC is well above the size below which the kernels stay serial (src/kernels/parallel.h).
  Case k(1001, 3, 75, 270);
  auto run = [&](int threads) {
    std::vector<float> dw(k.OC * k.C, 0.0f), db(k.OC, 0.0f);
    testing::with_threads(threads, [&] {
      matmul_backward(nullptr, dw.data(), db.data(), k.dout.data(), k.inp.data(), k.w.data(), k.N, k.C, k.OC);
    });
    return db;
  };
  const auto d1 = run(1), d2 = run(2), d3 = run(3);
  EXPECT_EQ(0, std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(d1.data(), d3.data(), d1.size() * sizeof(float)));
}

}  // namespace
}  // namespace st
