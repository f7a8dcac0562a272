#include "shardtrain/kernels/swiglu.h"

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

struct Fixture {
  int64_t N;
  int F;
  std::vector<float> gate_up, dout;
  // Gates of scale 3, into both tails of the sigmoid; up of scale 1.
  Fixture(int64_t n, int f, uint64_t stream) : N(n), F(f), dout(randn(n * f, stream + 2)) {
    const std::vector<float> gate = randn(n * f, stream, 3.0f), up = randn(n * f, stream + 1);
    gate_up.resize(n * 2 * f);
    for (int64_t r = 0; r < n; ++r) {
      for (int c = 0; c < f; ++c) {
        gate_up[r * 2 * f + c] = gate[r * f + c];
        gate_up[r * 2 * f + f + c] = up[r * f + c];
      }
    }
  }
};

struct Naive {
  std::vector<double> out, dgate_up;
};

// From the definition, in double: out = g sigmoid(g) u; d/dg = u (sigmoid(g) + g sigmoid(g) (1 - sigmoid(g))),
// d/du = g sigmoid(g).
Naive naive_swiglu(const Fixture& f) {
  Naive r;
  r.out.resize(f.N * f.F);
  r.dgate_up.resize(f.N * 2 * f.F);
  for (int64_t n = 0; n < f.N; ++n) {
    for (int c = 0; c < f.F; ++c) {
      const double g = f.gate_up[n * 2 * f.F + c], u = f.gate_up[n * 2 * f.F + f.F + c], d = f.dout[n * f.F + c];
      const double sig = 1.0 / (1.0 + std::exp(-g));
      r.out[n * f.F + c] = g * sig * u;
      r.dgate_up[n * 2 * f.F + c] = d * u * (sig + g * sig * (1.0 - sig));
      r.dgate_up[n * 2 * f.F + f.F + c] = d * g * sig;
    }
  }
  return r;
}

TEST(Swiglu, HandWorkedValues) {
  // gate 0: silu(0) = 0, silu'(0) = 1/2. gate_up = [0, 2 | 3, 5] (F = 2): out = [0, 2 sigmoid(2) * 5].
  const std::vector<float> gate_up = {0.0f, 2.0f, 3.0f, 5.0f}, dout = {1.0f, 1.0f};
  std::vector<float> out(2), d(4);
  swiglu_forward(out.data(), gate_up.data(), 1, 2);
  const double s2 = 1.0 / (1.0 + std::exp(-2.0));
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_FLOAT_EQ(out[1], static_cast<float>(2 * s2 * 5));
  swiglu_backward(d.data(), dout.data(), gate_up.data(), 1, 2);
  EXPECT_FLOAT_EQ(d[0], 1.5f);  // up 3 * silu'(0) = 3 / 2
  EXPECT_FLOAT_EQ(d[1], static_cast<float>(5 * (s2 + 2 * s2 * (1 - s2))));
  EXPECT_EQ(d[2], 0.0f);  // silu(0)
  EXPECT_FLOAT_EQ(d[3], static_cast<float>(2 * s2));
}

TEST(Swiglu, ForwardAndBackwardMatchDefinitionInDouble) {
  const Fixture f(7, 13, 400);
  std::vector<float> out(f.N * f.F), dgu(f.N * 2 * f.F);
  swiglu_forward(out.data(), f.gate_up.data(), f.N, f.F);
  swiglu_backward(dgu.data(), f.dout.data(), f.gate_up.data(), f.N, f.F);
  const Naive r = naive_swiglu(f);
  EXPECT_LE(max_rel_diff(out, r.out), testing::kRefTol);
  EXPECT_LE(max_rel_diff(dgu, r.dgate_up), testing::kRefTol);
}

TEST(Swiglu, BackwardMatchesFiniteDifferences) {
  Fixture f(5, 11, 410);
  const std::vector<float>& R = f.dout;  // L = sum(out * R), so dL/dout = R
  std::vector<float> out(f.N * f.F);
  auto loss = [&] {
    swiglu_forward(out.data(), f.gate_up.data(), f.N, f.F);
    return weighted_sum(out.data(), R);
  };
  std::vector<float> dgu(f.N * 2 * f.F);
  swiglu_backward(dgu.data(), R.data(), f.gate_up.data(), f.N, f.F);
  const auto fd = numeric_grad(f.gate_up.data(), f.N * 2 * f.F, testing::kFdStep, loss);
  ASSERT_GT(testing::max_abs(fd), 0.1);
  EXPECT_LE(max_rel_diff(dgu, fd), testing::kFdTol);
}

// Saturated gates: silu(g) -> 0 (as -0: exp(-g) overflows to inf) for g << 0 and -> g for g >> 0, with finite
// gradients (no inf * 0).
TEST(Swiglu, SaturatedGatesStayFinite) {
  const std::vector<float> gate_up = {-200.0f, 200.0f, 3.0f, 3.0f}, dout = {1.0f, 1.0f};
  std::vector<float> out(2), d(4);
  swiglu_forward(out.data(), gate_up.data(), 1, 2);
  swiglu_backward(d.data(), dout.data(), gate_up.data(), 1, 2);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 600.0f);
  EXPECT_EQ(d[0], 0.0f);
  EXPECT_EQ(d[1], 3.0f);  // up * silu'(200) = 3 * 1
  EXPECT_EQ(d[2], 0.0f);
  EXPECT_EQ(d[3], 200.0f);
}

// kOverwrite (the default) writes whatever dgate_up held; kAccumulate adds.
TEST(Swiglu, BackwardOverwritesOrAccumulates) {
  const Fixture f(6, 10, 420);
  const int64_t n = f.N * 2 * f.F;
  std::vector<float> once(n, std::nanf(""));
  swiglu_backward(once.data(), f.dout.data(), f.gate_up.data(), f.N, f.F);
  for (int64_t i = 0; i < n; ++i) ASSERT_FALSE(std::isnan(once[i])) << i;

  std::vector<float> acc(n, 0.0f);
  swiglu_backward(acc.data(), f.dout.data(), f.gate_up.data(), f.N, f.F, GradWrite::kAccumulate);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(acc[i], once[i]) << i;  // 0 + g is exact
  swiglu_backward(acc.data(), f.dout.data(), f.gate_up.data(), f.N, f.F, GradWrite::kAccumulate);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(acc[i], 2 * once[i]) << i;  // g + g is exact

  const std::vector<float> start = randn(n, 423);
  std::vector<float> added = start;
  swiglu_backward(added.data(), f.dout.data(), f.gate_up.data(), f.N, f.F, GradWrite::kAccumulate);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(added[i], start[i] + once[i]) << i;
}

// amax: the tensorwise maximum fp8_maxima takes of the tensor written (out; dgate_up written or as accumulated),
// folded into what *amax held; the outputs keep the bits of a run without it.
TEST(Swiglu, AmaxIsTheMaximumOfWhatItWrites) {
  const Fixture f(9, 40, 160);
  std::vector<float> plain(f.N * f.F), out(f.N * f.F);
  swiglu_forward(plain.data(), f.gate_up.data(), f.N, f.F);
  unsigned amax = 0;
  swiglu_forward(out.data(), f.gate_up.data(), f.N, f.F, &amax);
  EXPECT_EQ(0, std::memcmp(out.data(), plain.data(), out.size() * sizeof(float)));
  EXPECT_EQ(amax, testing::tensor_maximum(out));
  unsigned above = testing::maximum_bits(1e30f);
  swiglu_forward(out.data(), f.gate_up.data(), f.N, f.F, &above);
  EXPECT_EQ(above, testing::maximum_bits(1e30f));

  for (GradWrite write : {GradWrite::kOverwrite, GradWrite::kAccumulate}) {
    const std::vector<float> start = randn(f.N * 2 * f.F, 161);
    std::vector<float> dplain = start, d = start;
    swiglu_backward(dplain.data(), f.dout.data(), f.gate_up.data(), f.N, f.F, write);
    unsigned damax = 0;
    swiglu_backward(d.data(), f.dout.data(), f.gate_up.data(), f.N, f.F, write, &damax);
    EXPECT_EQ(0, std::memcmp(d.data(), dplain.data(), d.size() * sizeof(float)));
    EXPECT_EQ(damax, testing::tensor_maximum(d)) << (write == GradWrite::kOverwrite ? "overwrite" : "accumulate");
  }
}

TEST(Swiglu, DeterministicAcrossThreadCounts) {
  // Above the size below which the kernels stay serial.
  const Fixture f(301, 77, 430);
  testing::expect_same_bits_across_thread_counts([&] {
    std::vector<float> g(f.N * f.F + f.N * 2 * f.F);
    swiglu_forward(g.data(), f.gate_up.data(), f.N, f.F);
    swiglu_backward(g.data() + f.N * f.F, f.dout.data(), f.gate_up.data(), f.N, f.F);
    return g;
  });
}

}  // namespace
}  // namespace st

namespace st {
namespace {

// swiglu_forward_fp8: the codes in both layouts are those of casting swiglu_forward's out with the given maximum
// (fp8_quantize_with_maxima), its inverse scale and out's maximum as swiglu_forward's amax; a smaller maximum than
// out's saturates, a zero one scales by 1 (the codes of out itself), a non-finite element (an infinite up) gets the
// NaN code, so does every element under an infinite maximum, and either layout may be left out.
TEST(Swiglu, Fp8CastsTheOutputItDoesNotStore) {
  const Fixture x(6, 24, 40);
  std::vector<float> out(static_cast<size_t>(x.N * x.F));
  unsigned out_max = 0;
  swiglu_forward(out.data(), x.gate_up.data(), x.N, x.F, &out_max);
  float m = 0.0f;
  std::memcpy(&m, &out_max, sizeof(m));
  testing::expect_cast_ahead(out, x.N, x.F, {m, m / 4, 2 * m, 0.0f},
                             [&](uint8_t* q, uint8_t* q_t, float* inv, unsigned* own, Fp8Format f, const unsigned* a) {
                               swiglu_forward_fp8(q, q_t, inv, own, x.gate_up.data(), x.N, x.F, f, a);
                             });
  Fixture inf = x;
  inf.gate_up[2 * 2 * 24 + 24 + 5] = INFINITY;  // row 2's up at column 5: out[2, 5] is infinite (its gate is not 0)
  unsigned amax = 0;
  std::memcpy(&amax, &m, sizeof(amax));
  std::vector<uint8_t> q(out.size());
  float inv = 0;
  unsigned own = 0;
  swiglu_forward_fp8(q.data(), nullptr, &inv, &own, inf.gate_up.data(), x.N, x.F, Fp8Format::kE4M3, &amax);
  EXPECT_EQ(q[2 * 24 + 5], 0x7f);
  EXPECT_EQ(own, 0x7f800000u);
  // A non-finite given maximum: a NaN scale, every code NaN's, as the GPU's casts take it.
  const unsigned infinite = 0x7f800000u;
  swiglu_forward_fp8(q.data(), nullptr, &inv, nullptr, x.gate_up.data(), x.N, x.F, Fp8Format::kE5M2, &infinite);
  EXPECT_EQ(q, std::vector<uint8_t>(q.size(), 0x7f));
  EXPECT_TRUE(std::isnan(inv));
}

// swiglu_backward_fp8: dgate_up's codes in both layouts ([N, 2F] and [2F, N]) are those of casting swiglu_backward's
// dgate_up with the given maximum, and its maximum swiglu_backward's amax.
TEST(Swiglu, Fp8CastsTheGradientItDoesNotStore) {
  const Fixture x(6, 24, 50);
  const size_t n = static_cast<size_t>(x.N * 2 * x.F);
  std::vector<float> dgate_up(n);
  unsigned grad_max = 0;
  swiglu_backward(dgate_up.data(), x.dout.data(), x.gate_up.data(), x.N, x.F, GradWrite::kOverwrite, &grad_max);
  float m = 0.0f;
  std::memcpy(&m, &grad_max, sizeof(m));
  testing::expect_cast_ahead(dgate_up, x.N, 2 * x.F, {m, m / 8},
                             [&](uint8_t* q, uint8_t* q_t, float* inv, unsigned* own, Fp8Format f, const unsigned* a) {
                               swiglu_backward_fp8(q, q_t, inv, own, x.dout.data(), x.gate_up.data(), x.N, x.F, f, a);
                             });
}

}  // namespace
}  // namespace st
