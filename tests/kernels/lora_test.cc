// st::lora_forward / st::lora_backward (kernels/lora.h) against the definition in double: an adapter writing a row
// slice of a wider output (row0 > 0, ldo > rows), accumulating and written parameter gradients, and dx null.
#include "shardtrain/kernels/lora.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "grad_check.h"

namespace st {
namespace {

using testing::kRefTol;
using testing::max_rel_diff;
using testing::randn;

// N rows of x [N, in] through A [r, in] and B [rows, r] into columns [row0, row0 + rows) of out [N, ldo].
struct Fixture {
  int64_t N;
  int in, r, rows, row0, ldo;
  float scale;
  std::vector<float> x, A, B, out0, dout;
  Fixture(int64_t n, int in_, int r_, int rows_, int row0_, int ldo_, uint64_t stream)
      : N(n), in(in_), r(r_), rows(rows_), row0(row0_), ldo(ldo_), scale(5.0f / 3.0f) {
    x = randn(N * in, stream);
    A = randn(int64_t{r} * in, stream + 1, 0.3f);
    B = randn(int64_t{rows} * r, stream + 2, 0.3f);
    out0 = randn(N * ldo, stream + 3);
    dout = randn(N * ldo, stream + 4);
  }
};

// The definition in double: h = x A^T; out[:, row0 + i] += scale (h B^T)[:, i]; with g = dout[:, row0 ..):
// dh = scale g B, dB = scale g^T h, dA = dh^T x, dx = dh A.
struct Naive {
  std::vector<double> h, out, dA, dB, dx;
};

Naive naive_lora(const Fixture& f) {
  Naive z;
  z.h.assign(f.N * f.r, 0.0);
  z.out.assign(f.out0.begin(), f.out0.end());
  z.dA.assign(int64_t{f.r} * f.in, 0.0);
  z.dB.assign(int64_t{f.rows} * f.r, 0.0);
  z.dx.assign(f.N * f.in, 0.0);
  for (int64_t n = 0; n < f.N; ++n) {
    for (int k = 0; k < f.r; ++k)
      for (int c = 0; c < f.in; ++c) z.h[n * f.r + k] += static_cast<double>(f.x[n * f.in + c]) * f.A[k * f.in + c];
    std::vector<double> dh(f.r, 0.0);
    for (int i = 0; i < f.rows; ++i) {
      double u = 0;
      for (int k = 0; k < f.r; ++k) u += z.h[n * f.r + k] * f.B[i * f.r + k];
      z.out[n * f.ldo + f.row0 + i] += f.scale * u;
      const double g = f.dout[n * f.ldo + f.row0 + i];
      for (int k = 0; k < f.r; ++k) {
        dh[k] += f.scale * g * f.B[i * f.r + k];
        z.dB[i * f.r + k] += f.scale * g * z.h[n * f.r + k];
      }
    }
    for (int k = 0; k < f.r; ++k)
      for (int c = 0; c < f.in; ++c) {
        z.dA[k * f.in + c] += dh[k] * f.x[n * f.in + c];
        z.dx[n * f.in + c] += dh[k] * f.A[k * f.in + c];
      }
  }
  return z;
}

const Fixture kFixtures[] = {
    {1, 7, 1, 5, 0, 5, 10}, {37, 13, 3, 11, 4, 19, 20}, {130, 64, 3, 48, 96, 192, 30}, {5, 24, 8, 3, 1, 7, 40}};

TEST(Lora, ForwardWritesHAndAddsToItsColumnsOnly) {
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(::testing::Message() << "N=" << f.N << " in=" << f.in << " r=" << f.r << " rows=" << f.rows);
    const Naive z = naive_lora(f);
    std::vector<float> out = f.out0, h(f.N * f.r, NAN);
    lora_forward(out.data() + f.row0, f.ldo, h.data(), f.x.data(), f.A.data(), f.B.data(), f.N, f.in, f.r, f.rows,
                 f.scale);
    EXPECT_LE(max_rel_diff(h, z.h), kRefTol);
    EXPECT_LE(max_rel_diff(out, z.out), kRefTol);
    for (int64_t n = 0; n < f.N; ++n)  // the columns outside the slice keep their bits
      for (int c = 0; c < f.ldo; ++c)
        if (c < f.row0 || c >= f.row0 + f.rows) EXPECT_EQ(out[n * f.ldo + c], f.out0[n * f.ldo + c]);
  }
}

// Accumulate: dA, dB and dx add to what they held. Overwrite: dA and dB (NaN first) are written; dx still adds.
TEST(Lora, BackwardAccumulatesOrWritesTheParameterGradients) {
  for (const Fixture& f : kFixtures) {
    SCOPED_TRACE(::testing::Message() << "N=" << f.N << " in=" << f.in << " r=" << f.r << " rows=" << f.rows);
    const Naive z = naive_lora(f);
    std::vector<float> h(f.N * f.r), out = f.out0;
    lora_forward(out.data() + f.row0, f.ldo, h.data(), f.x.data(), f.A.data(), f.B.data(), f.N, f.in, f.r, f.rows,
                 f.scale);
    const std::vector<float> dA0 = randn(int64_t{f.r} * f.in, 50), dB0 = randn(int64_t{f.rows} * f.r, 51),
                             dx0 = randn(f.N * f.in, 52);
    auto plus = [](const std::vector<double>& a, const std::vector<float>& b) {
      std::vector<double> s(a);
      for (size_t i = 0; i < s.size(); ++i) s[i] += b[i];
      return s;
    };
    for (const GradWrite w : {GradWrite::kAccumulate, GradWrite::kOverwrite}) {
      const bool add = w == GradWrite::kAccumulate;
      std::vector<float> dA = dA0, dB = dB0, dx = dx0, dh(f.N * f.r, NAN);
      if (!add) {
        dA.assign(dA.size(), NAN);
        dB.assign(dB.size(), NAN);
      }
      lora_backward(dx.data(), dA.data(), dB.data(), dh.data(), f.dout.data() + f.row0, f.ldo, f.x.data(), h.data(),
                    f.A.data(), f.B.data(), f.N, f.in, f.r, f.rows, f.scale, w);
      EXPECT_LE(max_rel_diff(dA, add ? plus(z.dA, dA0) : z.dA), kRefTol) << "dA";
      EXPECT_LE(max_rel_diff(dB, add ? plus(z.dB, dB0) : z.dB), kRefTol) << "dB";
      EXPECT_LE(max_rel_diff(dx, plus(z.dx, dx0)), kRefTol) << "dx";
    }
  }
}

// dx null: the parameter gradients alone, the same bits as with dx; no rows: written gradients are zero.
TEST(Lora, BackwardWithoutDxAndWithoutRows) {
  const Fixture& f = kFixtures[1];
  std::vector<float> h(f.N * f.r), out = f.out0, dh(f.N * f.r);
  lora_forward(out.data() + f.row0, f.ldo, h.data(), f.x.data(), f.A.data(), f.B.data(), f.N, f.in, f.r, f.rows,
               f.scale);
  std::vector<float> dA(int64_t{f.r} * f.in, 0.0f), dB(int64_t{f.rows} * f.r, 0.0f), dx(f.N * f.in, 0.0f);
  std::vector<float> dA2 = dA, dB2 = dB;
  lora_backward(dx.data(), dA.data(), dB.data(), dh.data(), f.dout.data() + f.row0, f.ldo, f.x.data(), h.data(),
                f.A.data(), f.B.data(), f.N, f.in, f.r, f.rows, f.scale);
  lora_backward(nullptr, dA2.data(), dB2.data(), dh.data(), f.dout.data() + f.row0, f.ldo, f.x.data(), h.data(),
                f.A.data(), f.B.data(), f.N, f.in, f.r, f.rows, f.scale);
  EXPECT_EQ(dA2, dA);
  EXPECT_EQ(dB2, dB);
  std::vector<float> dA0(dA.size(), NAN), dB0(dB.size(), NAN);
  lora_backward(nullptr, dA0.data(), dB0.data(), dh.data(), f.dout.data(), f.ldo, f.x.data(), h.data(), f.A.data(),
                f.B.data(), 0, f.in, f.r, f.rows, f.scale, GradWrite::kOverwrite);
  EXPECT_EQ(dA0, std::vector<float>(dA.size(), 0.0f));
  EXPECT_EQ(dB0, std::vector<float>(dB.size(), 0.0f));
}

}  // namespace
}  // namespace st
