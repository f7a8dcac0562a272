// st::lora_forward / st::lora_backward (kernels/lora.h) against the definition in double: stacks of one to three
// adapters writing slices of a wider output (row0 > 0, ldo > rows, a gap between slices), the output and the input
// gradient added to or written, accumulating and written parameter gradients, and dx null.
#include "shardtrain/kernels/lora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "grad_check.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

using testing::kRefTol;
using testing::max_rel_diff;
using testing::randn;

// N rows of x [N, in] through the stacked A [count * r, in] and B [sum of rows, r] into out [N, ldo].
struct Fixture {
  int64_t N;
  LoraStack s;
  int ldo;
  float scale = 5.0f / 3.0f;
  std::vector<float> x, A, B, out0, dout;
  Fixture(int64_t n, int in, int r, std::vector<LoraSlice> slices, int ldo_, uint64_t stream)
      : N(n), s{in, r, std::move(slices)}, ldo(ldo_) {
    x = randn(N * in, stream);
    A = randn(int64_t{s.width()} * in, stream + 1, 0.3f);
    B = randn(s.b_rows() * r, stream + 2, 0.3f);
    out0 = randn(N * ldo, stream + 3);
    dout = randn(N * ldo, stream + 4);
  }
};

// The definition in double, adapter by adapter: h_j = x A_j^T; out[:, row0_j + i] += scale (h_j B_j^T)[:, i]; with
// g_j = dout[:, row0_j ..): dh_j = scale g_j B_j, dB_j = scale g_j^T h_j, dA_j = dh_j^T x, dx = sum_j dh_j A_j.
// h, dA and dB as the stack lays them out (h [N, count * r]).
struct Naive {
  std::vector<double> h, out, dA, dB, dx;
};

Naive naive_lora(const Fixture& f) {
  const int in = f.s.in, r = f.s.r, w = f.s.width();
  Naive z;
  z.h.assign(f.N * w, 0.0);
  z.out.assign(f.out0.begin(), f.out0.end());
  z.dA.assign(int64_t{w} * in, 0.0);
  z.dB.assign(f.s.b_rows() * r, 0.0);
  z.dx.assign(f.N * in, 0.0);
  int64_t b_row = 0;
  for (size_t j = 0; j < f.s.slices.size(); ++j) {
    const LoraSlice& sl = f.s.slices[j];
    const float* A = f.A.data() + j * r * in;
    const float* B = f.B.data() + b_row * r;
    double* dB = z.dB.data() + b_row * r;
    double* dA = z.dA.data() + j * r * in;
    for (int64_t n = 0; n < f.N; ++n) {
      double* h = z.h.data() + n * w + j * r;
      for (int k = 0; k < r; ++k)
        for (int c = 0; c < in; ++c) h[k] += static_cast<double>(f.x[n * in + c]) * A[k * in + c];
      std::vector<double> dh(r, 0.0);
      for (int64_t i = 0; i < sl.rows; ++i) {
        double u = 0;
        for (int k = 0; k < r; ++k) u += h[k] * B[i * r + k];
        z.out[n * f.ldo + sl.row0 + i] += f.scale * u;
        const double g = f.dout[n * f.ldo + sl.row0 + i];
        for (int k = 0; k < r; ++k) {
          dh[k] += f.scale * g * B[i * r + k];
          dB[i * r + k] += f.scale * g * h[k];
        }
      }
      for (int k = 0; k < r; ++k)
        for (int c = 0; c < in; ++c) {
          dA[k * in + c] += dh[k] * f.x[n * in + c];
          z.dx[n * in + c] += dh[k] * A[k * in + c];
        }
    }
    b_row += sl.rows;
  }
  return z;
}

// One adapter (rank 1, a slice at column 0 of an output exactly as wide), q/k/v-like stacks of three (one with a
// gap: the middle slice not targeted), and a stack of two ending short of ldo.
const Fixture kFixtures[] = {{1, 7, 1, {{0, 5}}, 5, 10},
                             {37, 13, 3, {{4, 11}}, 19, 20},
                             {130, 64, 3, {{0, 32}, {32, 8}, {40, 8}}, 48, 30},
                             {5, 24, 8, {{1, 3}, {6, 2}}, 9, 40},
                             {33, 20, 2, {{0, 10}, {15, 5}, {20, 7}}, 27, 50}};

std::string describe(const Fixture& f) {
  std::string out = "N=" + std::to_string(f.N) + " in=" + std::to_string(f.s.in) + " r=" + std::to_string(f.s.r);
  for (const LoraSlice& sl : f.s.slices) out += " [" + std::to_string(sl.row0) + "+" + std::to_string(sl.rows) + "]";
  return out;
}

// Accumulate adds to out's slices; overwrite writes them (NaN before); the columns outside the slices keep their bits.
TEST(Lora, ForwardWritesHAndItsColumnsOnly) {
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(describe(f));
    const Naive z = naive_lora(f);
    for (const GradWrite write : {GradWrite::kAccumulate, GradWrite::kOverwrite}) {
      const bool add = write == GradWrite::kAccumulate;
      std::vector<float> out = f.out0, h(f.N * f.s.width(), NAN);
      std::vector<double> want = z.out;
      for (const LoraSlice& sl : f.s.slices)
        for (int64_t n = 0; n < f.N; ++n)
          for (int64_t i = sl.row0; i < sl.row0 + sl.rows; ++i) {
            if (!add) want[n * f.ldo + i] -= f.out0[n * f.ldo + i];
            if (!add) out[n * f.ldo + i] = NAN;
          }
      lora_forward(out.data(), f.ldo, write, h.data(), f.x.data(), f.A.data(), f.B.data(), f.N, f.s, f.scale);
      EXPECT_LE(max_rel_diff(h, z.h), kRefTol);
      EXPECT_LE(max_rel_diff(out, want), kRefTol) << "accumulate " << add;
      for (int64_t n = 0; n < f.N; ++n)
        for (int c = 0; c < f.ldo; ++c) {
          bool inside = false;
          for (const LoraSlice& sl : f.s.slices) inside |= c >= sl.row0 && c < sl.row0 + sl.rows;
          if (!inside) ASSERT_EQ(out[n * f.ldo + c], f.out0[n * f.ldo + c]) << n << ", " << c;
        }
    }
  }
}

std::vector<double> plus(const std::vector<double>& a, const std::vector<float>& b) {
  std::vector<double> s(a);
  for (size_t i = 0; i < s.size(); ++i) s[i] += b[i];
  return s;
}

// Accumulate: dA, dB add to what they held; overwrite: written (NaN before). dx likewise by its own GradWrite.
TEST(Lora, BackwardAccumulatesOrWritesTheGradients) {
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(describe(f));
    const Naive z = naive_lora(f);
    const int w = f.s.width();
    std::vector<float> h(f.N * w), out = f.out0;
    lora_forward(out.data(), f.ldo, GradWrite::kAccumulate, h.data(), f.x.data(), f.A.data(), f.B.data(), f.N, f.s,
                 f.scale);
    const std::vector<float> dA0 = randn(int64_t{w} * f.s.in, 50), dB0 = randn(f.s.b_rows() * f.s.r, 51),
                             dx0 = randn(f.N * f.s.in, 52);
    for (const GradWrite pw : {GradWrite::kAccumulate, GradWrite::kOverwrite})
      for (const GradWrite xw : {GradWrite::kAccumulate, GradWrite::kOverwrite}) {
        const bool add = pw == GradWrite::kAccumulate, add_x = xw == GradWrite::kAccumulate;
        std::vector<float> dA = dA0, dB = dB0, dx = dx0, dh(f.N * w, NAN);
        if (!add) dA.assign(dA.size(), NAN), dB.assign(dB.size(), NAN);
        if (!add_x) dx.assign(dx.size(), NAN);
        lora_backward(dx.data(), xw, dA.data(), dB.data(), dh.data(), f.dout.data(), f.ldo, f.x.data(), h.data(),
                      f.A.data(), f.B.data(), f.N, f.s, f.scale, pw);
        EXPECT_LE(max_rel_diff(dA, add ? plus(z.dA, dA0) : z.dA), kRefTol) << "dA";
        EXPECT_LE(max_rel_diff(dB, add ? plus(z.dB, dB0) : z.dB), kRefTol) << "dB";
        EXPECT_LE(max_rel_diff(dx, add_x ? plus(z.dx, dx0) : z.dx), kRefTol) << "dx";
      }
  }
}

// dx null: the parameter gradients alone, the same bits as with dx; no rows: written gradients are zero.
TEST(Lora, BackwardWithoutDxAndWithoutRows) {
  const Fixture& f = kFixtures[2];
  const int w = f.s.width();
  std::vector<float> h(f.N * w), out = f.out0, dh(f.N * w);
  lora_forward(out.data(), f.ldo, GradWrite::kAccumulate, h.data(), f.x.data(), f.A.data(), f.B.data(), f.N, f.s,
               f.scale);
  std::vector<float> dA(int64_t{w} * f.s.in, 0.0f), dB(f.s.b_rows() * f.s.r, 0.0f), dx(f.N * f.s.in, 0.0f);
  std::vector<float> dA2 = dA, dB2 = dB;
  lora_backward(dx.data(), GradWrite::kAccumulate, dA.data(), dB.data(), dh.data(), f.dout.data(), f.ldo, f.x.data(),
                h.data(), f.A.data(), f.B.data(), f.N, f.s, f.scale);
  lora_backward(nullptr, GradWrite::kAccumulate, dA2.data(), dB2.data(), dh.data(), f.dout.data(), f.ldo, f.x.data(),
                h.data(), f.A.data(), f.B.data(), f.N, f.s, f.scale);
  EXPECT_EQ(dA2, dA);
  EXPECT_EQ(dB2, dB);
  std::vector<float> dA0(dA.size(), NAN), dB0(dB.size(), NAN);
  lora_backward(nullptr, GradWrite::kAccumulate, dA0.data(), dB0.data(), dh.data(), f.dout.data(), f.ldo, f.x.data(),
                h.data(), f.A.data(), f.B.data(), 0, f.s, f.scale, GradWrite::kOverwrite);
  EXPECT_EQ(dA0, std::vector<float>(dA.size(), 0.0f));
  EXPECT_EQ(dB0, std::vector<float>(dB.size(), 0.0f));
}

// A slice outside the output is refused, naming its columns.
TEST(Lora, RefusesASliceOutsideTheOutput) {
  const Fixture& f = kFixtures[3];
  std::vector<float> out = f.out0, h(f.N * f.s.width());
  try {
    lora_forward(out.data(), 7, GradWrite::kAccumulate, h.data(), f.x.data(), f.A.data(), f.B.data(), f.N, f.s,
                 f.scale);
    FAIL() << "accepted a slice past the output";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[6, 8) outside the output's 7"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace st
