// The FP8 GEMM's CPU reference (kernels/fp8_gemm.h) against the definition in double: the sum over k of the
// dequantised operands' products, decode(code) * inverse scale, added to out or written. Both recipes (one scale per
// operand, one per row with power-of-two scales), E4M3 x E4M3, E5M2 x E4M3 and E4M3 x E5M2, written and accumulated,
// m and n odd, padded rows (lda, ldb > k; ldo > n, the padding untouched); a linear layer's three GEMMs from the casts
// the FP8 policy names, transposed where the GEMM needs its operand K-contiguous; and the shapes refused, by name.
#include "shardtrain/kernels/fp8_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "../common/caught.h"
#include "grad_check.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/fp8.h"

namespace st {
namespace {

using testing::kRefTol;
using testing::max_rel_diff;

// A cast operand: the codes of a [rows, cols] matrix (transposed when asked) in rows of `ld` codes, and its scales.
struct Operand {
  std::vector<uint8_t> codes;
  std::vector<float> inverse;
  int64_t rows = 0, k = 0, ld = 0;
  Fp8Format format = Fp8Format::kE4M3;
  bool per_row = false;

  Fp8GemmOperand view() const { return {codes.data(), ld, format, inverse.data(), per_row}; }
  // decode(code) * inverse scale of element (r, c), in double.
  double value(int64_t r, int64_t c) const {
    return static_cast<double>(fp8_decode(codes[static_cast<size_t>(r * ld + c)], format)) *
           inverse[static_cast<size_t>(per_row ? r : 0)];
  }
};

// x [rows, cols] cast with `scaling` (rowwise recipes: power-of-two scales) into an operand of the GEMM: x itself
// (k = cols) or, with kTransposed, x^T (k = rows). The operand's rows must be the scaling's groups, or one group.
Operand cast(const std::vector<float>& x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling, Fp8Layout layout,
             int64_t pad = 0) {
  const bool transposed = layout == Fp8Layout::kTransposed;
  Operand o;
  o.rows = transposed ? cols : rows;
  o.k = transposed ? rows : cols;
  o.ld = o.k + pad;
  o.format = f;
  o.per_row = scaling != Fp8Scaling::kTensor;
  std::vector<uint8_t> packed(x.size());
  o.inverse.resize(static_cast<size_t>(fp8_groups(scaling, rows, cols)));
  fp8_quantize_matrix(x.data(), rows, cols, f, scaling, o.per_row, layout, packed.data(), o.inverse.data(), "x");
  o.codes.assign(static_cast<size_t>(o.rows * o.ld), 0x7f);  // the padding holds NaN codes: never read
  for (int64_t r = 0; r < o.rows; ++r)
    for (int64_t c = 0; c < o.k; ++c)
      o.codes[static_cast<size_t>(r * o.ld + c)] = packed[static_cast<size_t>(r * o.k + c)];
  return o;
}

// The definition: out0 (when accumulating) + sum_k value_a(i, k) value_b(j, k), in double.
std::vector<double> reference(const Operand& a, const Operand& b, const std::vector<float>& out0, int64_t ldo,
                              GradWrite write) {
  std::vector<double> ref(static_cast<size_t>(a.rows * b.rows));
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < b.rows; ++j) {
      double s = write == GradWrite::kAccumulate ? out0[static_cast<size_t>(i * ldo + j)] : 0.0;
      for (int64_t c = 0; c < a.k; ++c) s += a.value(i, c) * b.value(j, c);
      ref[static_cast<size_t>(i * b.rows + j)] = s;
    }
  return ref;
}

// out [m, n] (pitch ldo) from its start value out0 (NaN when overwriting: never read), compared with the definition;
// the padding columns past n keep out0's bits.
void expect_gemm_matches(const Operand& a, const Operand& b, int64_t ldo, GradWrite write, uint64_t seed) {
  const int64_t m = a.rows, n = b.rows;
  std::vector<float> out0 = testing::randn(m * ldo, seed);
  if (write == GradWrite::kOverwrite)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) out0[static_cast<size_t>(i * ldo + j)] = NAN;
  std::vector<float> out = out0;
  fp8_gemm(out.data(), ldo, write, a.view(), b.view(), m, n, a.k);
  std::vector<float> got(static_cast<size_t>(m * n));
  int64_t padding_changed = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < ldo; ++j) {
      const size_t at = static_cast<size_t>(i * ldo + j);
      if (j < n)
        got[static_cast<size_t>(i * n + j)] = out[at];
      else
        padding_changed += out[at] != out0[at] ? 1 : 0;
    }
  EXPECT_LE(max_rel_diff(got, reference(a, b, out0, ldo, write)), kRefTol);
  EXPECT_EQ(padding_changed, 0);
}

struct Shape {
  int64_t m, n, k, pad_a, pad_b, pad_out;
};
// m and n odd (no tile divides them), k from one 16-code block up; rows padded past k and out past n.
constexpr Shape kShapes[] = {
    {1, 1, 16, 0, 0, 0}, {7, 33, 48, 0, 0, 0}, {65, 17, 16, 16, 0, 3}, {31, 129, 144, 0, 32, 1}};

struct Formats {
  Fp8Format a, b;
};
constexpr Formats kFormatPairs[] = {
    {Fp8Format::kE4M3, Fp8Format::kE4M3}, {Fp8Format::kE5M2, Fp8Format::kE4M3}, {Fp8Format::kE4M3, Fp8Format::kE5M2}};

TEST(Fp8Gemm, MatchesTheDequantisedProductInDouble) {
  uint64_t seed = 1;
  for (const Shape& s : kShapes)
    for (const Formats& f : kFormatPairs)
      for (bool rowwise : {false, true})
        for (GradWrite write : {GradWrite::kOverwrite, GradWrite::kAccumulate}) {
          SCOPED_TRACE(::testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k << " " << to_string(f.a)
                                            << " x " << to_string(f.b) << (rowwise ? " rowwise" : " tensorwise")
                                            << (write == GradWrite::kAccumulate ? " +=" : " ="));
          // Rows of A five orders of magnitude apart: a tensorwise scale flushes the small ones, a row's keeps them.
          std::vector<float> xa = testing::randn(s.m * s.k, ++seed, 3.0f);
          for (int64_t c = 0; c < s.k; ++c) xa[static_cast<size_t>(c)] *= 1e-5f;
          const std::vector<float> xb = testing::randn(s.n * s.k, ++seed, 0.05f);
          const Fp8Scaling scaling = rowwise ? Fp8Scaling::kRow : Fp8Scaling::kTensor;
          const Operand a = cast(xa, s.m, s.k, f.a, scaling, Fp8Layout::kRowMajor, s.pad_a);
          const Operand b = cast(xb, s.n, s.k, f.b, scaling, Fp8Layout::kRowMajor, s.pad_b);
          expect_gemm_matches(a, b, s.n + s.pad_out, write, ++seed);
        }
}

// A bias and a residual ride in the GEMM: out = residual + product + bias, summed in double and rounded once (out's old
// value unread); without the residual, += adds the bias to out's old value and the product.
TEST(Fp8Gemm, AddsTheBiasAndTheResidual) {
  const int64_t m = 33, n = 40, k = 48, ldo = 43;
  for (bool rowwise : {false, true}) {
    SCOPED_TRACE(rowwise ? "rowwise" : "tensorwise");
    const Fp8Scaling scaling = rowwise ? Fp8Scaling::kRow : Fp8Scaling::kTensor;
    const Operand a = cast(testing::randn(m * k, 81), m, k, Fp8Format::kE4M3, scaling, Fp8Layout::kRowMajor);
    const Operand b = cast(testing::randn(n * k, 82, 0.05f), n, k, Fp8Format::kE4M3, scaling, Fp8Layout::kRowMajor);
    const std::vector<float> bias = testing::randn(n, 83), residual = testing::randn(m * ldo, 84),
                             out0 = testing::randn(m * ldo, 85);
    const std::vector<double> product = reference(a, b, out0, ldo, GradWrite::kOverwrite);
    for (const bool with_residual : {false, true}) {
      std::vector<float> out = out0, got;
      fp8_gemm(out.data(), ldo, with_residual ? GradWrite::kOverwrite : GradWrite::kAccumulate, a.view(), b.view(), m,
               n, k, bias.data(), with_residual ? residual.data() : nullptr);
      std::vector<double> want;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          const size_t at = static_cast<size_t>(i * ldo + j);
          got.push_back(out[at]);
          want.push_back((with_residual ? residual[at] : out0[at]) + product[static_cast<size_t>(i * n + j)] +
                         bias[static_cast<size_t>(j)]);
        }
      EXPECT_LE(max_rel_diff(got, want), kRefTol) << "residual " << with_residual;
    }
  }
  std::vector<float> out(static_cast<size_t>(m * ldo)), residual = out;
  const Operand a = cast(testing::randn(m * k, 86), m, k, Fp8Format::kE4M3, Fp8Scaling::kTensor, Fp8Layout::kRowMajor);
  EXPECT_THROW(fp8_gemm(out.data(), ldo, GradWrite::kAccumulate, a.view(), a.view(), m, m, k, nullptr, residual.data()),
               Error);
}

// A linear layer y = x W^T with the FP8 policy's casts (model/fp8_policy.h): forward x (per row) and W (per row) in
// E4M3; input gradient dy (per row, E5M2) and W^T (W per column, cast transposed); weight gradient dy^T (dy per
// column, transposed, E5M2) and x^T (x per column, transposed). Each GEMM is the product of the operands as
// fp8_round_trip dequantises them in the layer's own layout, which also checks that the transposed casts hand the
// GEMM the right matrix.
TEST(Fp8Gemm, LinearLayerGemmsMatchTheRoundTrippedOperands) {
  const int64_t N = 48, C = 64, OC = 80;
  const std::vector<float> x = testing::randn(N * C, 11), w = testing::randn(OC * C, 12, 0.02f),
                           dy = testing::randn(N * OC, 13, 1e-3f);
  for (bool rowwise : {false, true}) {
    SCOPED_TRACE(rowwise ? "rowwise" : "tensorwise");
    const auto by = [&](Fp8Scaling s) { return rowwise ? s : Fp8Scaling::kTensor; };
    const auto round_trip = [&](const std::vector<float>& v, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling s) {
      std::vector<float> out(v.size());
      fp8_round_trip(v.data(), rows, cols, f, by(s), rowwise, out.data(), "operand");
      return out;
    };
    // want[i, j] = sum_k lhs[i, k] rhs[k, j], lhs [m, kk] and rhs [kk, n] row-major, in double.
    const auto product = [](const std::vector<float>& lhs, const std::vector<float>& rhs, int64_t m, int64_t kk,
                            int64_t n) {
      std::vector<double> want(static_cast<size_t>(m * n), 0.0);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t c = 0; c < kk; ++c)
          for (int64_t j = 0; j < n; ++j)
            want[static_cast<size_t>(i * n + j)] +=
                static_cast<double>(lhs[static_cast<size_t>(i * kk + c)]) * rhs[static_cast<size_t>(c * n + j)];
      return want;
    };
    const auto transpose = [](const std::vector<float>& v, int64_t rows, int64_t cols) {
      std::vector<float> t(v.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) t[static_cast<size_t>(c * rows + r)] = v[static_cast<size_t>(r * cols + c)];
      return t;
    };
    const auto run = [](const Operand& a, const Operand& b) {
      std::vector<float> out(static_cast<size_t>(a.rows * b.rows));
      fp8_gemm(out.data(), b.rows, GradWrite::kOverwrite, a.view(), b.view(), a.rows, b.rows, a.k);
      return out;
    };
    constexpr Fp8Format kE4M3 = Fp8Format::kE4M3, kE5M2 = Fp8Format::kE5M2;
    const Fp8Layout kRowMajor = Fp8Layout::kRowMajor, kTransposed = Fp8Layout::kTransposed;

    // forward: y [N, OC] = x [N, C] . W^T
    const std::vector<float> y = run(cast(x, N, C, kE4M3, by(Fp8Scaling::kRow), kRowMajor),
                                     cast(w, OC, C, kE4M3, by(Fp8Scaling::kRow), kRowMajor));
    const std::vector<double> y_want =
        product(round_trip(x, N, C, kE4M3, Fp8Scaling::kRow),
                transpose(round_trip(w, OC, C, kE4M3, Fp8Scaling::kRow), OC, C), N, C, OC);
    EXPECT_LE(max_rel_diff(y, y_want), kRefTol);

    // input gradient: dx [N, C] = dy [N, OC] . W [OC, C]
    const std::vector<float> dx = run(cast(dy, N, OC, kE5M2, by(Fp8Scaling::kRow), kRowMajor),
                                      cast(w, OC, C, kE4M3, by(Fp8Scaling::kColumn), kTransposed));
    const std::vector<double> dx_want = product(round_trip(dy, N, OC, kE5M2, Fp8Scaling::kRow),
                                                round_trip(w, OC, C, kE4M3, Fp8Scaling::kColumn), N, OC, C);
    EXPECT_LE(max_rel_diff(dx, dx_want), kRefTol);

    // weight gradient: dW [OC, C] = dy^T [OC, N] . x [N, C]
    const std::vector<float> dw = run(cast(dy, N, OC, kE5M2, by(Fp8Scaling::kColumn), kTransposed),
                                      cast(x, N, C, kE4M3, by(Fp8Scaling::kColumn), kTransposed));
    const std::vector<double> dw_want = product(transpose(round_trip(dy, N, OC, kE5M2, Fp8Scaling::kColumn), N, OC),
                                                round_trip(x, N, C, kE4M3, Fp8Scaling::kColumn), OC, N, C);
    EXPECT_LE(max_rel_diff(dw, dw_want), kRefTol);
  }
}

// Shapes cuBLASLt's FP8 GEMMs cannot take are refused on the CPU as well (the GPU runs the same check), naming the
// GEMM and the rule; m = n = 0 is nothing to do.
TEST(Fp8Gemm, RefusesShapesCublasLtCannotTake) {
  std::vector<uint8_t> codes(64 * 48, 0x38);  // 1.0 in E4M3
  std::vector<float> scales(64, 1.0f), out(64 * 64, 0.0f);
  const Fp8GemmOperand e4m3{codes.data(), 48, Fp8Format::kE4M3, scales.data(), false};
  const auto refusal = [&](const Fp8GemmOperand& a, const Fp8GemmOperand& b, int64_t m, int64_t n, int64_t k) {
    const Error e = testing::caught([&] { fp8_gemm(out.data(), 64, GradWrite::kOverwrite, a, b, m, n, k); });
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    return std::string(e.what());
  };
  const auto has = [](const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                                : ::testing::AssertionFailure() << "'" << part << "' not in " << text;
  };
  Fp8GemmOperand e4m3_ld40 = e4m3;
  e4m3_ld40.ld = 40;
  EXPECT_TRUE(has(refusal(e4m3_ld40, e4m3_ld40, 3, 5, 40), "FP8 GEMM m=3 n=5 k=40 (e4m3 x e4m3"));
  EXPECT_TRUE(has(refusal(e4m3_ld40, e4m3_ld40, 3, 5, 40), "multiples of 16"));
  EXPECT_TRUE(has(refusal(e4m3, e4m3_ld40, 3, 5, 32), "ldb=40"));
  Fp8GemmOperand e5m2 = e4m3;
  e5m2.format = Fp8Format::kE5M2;
  EXPECT_TRUE(has(refusal(e5m2, e5m2, 3, 5, 48), "FP8 GEMM m=3 n=5 k=48 (e5m2 x e5m2"));
  EXPECT_TRUE(has(refusal(e5m2, e5m2, 3, 5, 48), "no E5M2 x E5M2 GEMM"));
  Fp8GemmOperand rows = e4m3;
  rows.per_row = true;
  EXPECT_TRUE(has(refusal(rows, e4m3, 3, 5, 48), "both operands' scales must be per row"));
  EXPECT_TRUE(has(refusal(e4m3, e4m3, 3, 65, 48), "ldo=64"));  // ldo < n
  EXPECT_TRUE(has(refusal(e4m3, e4m3, 3, 5, 0), "k=0"));
  // Nothing to compute: out untouched.
  out[0] = 7.0f;
  fp8_gemm(out.data(), 64, GradWrite::kOverwrite, e4m3, e4m3, 0, 5, 48);
  fp8_gemm(out.data(), 64, GradWrite::kOverwrite, e4m3, e4m3, 3, 0, 48);
  EXPECT_EQ(out[0], 7.0f);
}

}  // namespace
}  // namespace st
