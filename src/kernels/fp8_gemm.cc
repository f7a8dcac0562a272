#include "shardtrain/kernels/fp8_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <climits>
#include <sstream>
#include <vector>

#include "parallel.h"
#include "shardtrain/core/error.h"

namespace st {

using kernels_internal::kMinParallelWork;

std::string describe_fp8_gemm(const Fp8GemmOperand& a, const Fp8GemmOperand& b, int64_t m, int64_t n, int64_t k,
                              int64_t ldo) {
  std::ostringstream s;
  s << "FP8 GEMM m=" << m << " n=" << n << " k=" << k << " (" << to_string(a.format) << " x " << to_string(b.format)
    << ", " << (a.per_row ? "rowwise" : "tensorwise") << (a.per_row == b.per_row ? "" : "/mixed")
    << " scales, lda=" << a.ld << " ldb=" << b.ld << " ldo=" << ldo << ")";
  return s.str();
}

void check_fp8_gemm(const Fp8GemmOperand& a, const Fp8GemmOperand& b, int64_t m, int64_t n, int64_t k, int64_t ldo) {
  const auto what = [&] { return describe_fp8_gemm(a, b, m, n, k, ldo); };
  ST_CHECK(m >= 0 && n >= 0 && k > 0 && ldo >= n, what(), ": bad shape");
  ST_CHECK(k % 16 == 0 && a.ld % 16 == 0 && b.ld % 16 == 0 && a.ld >= k && b.ld >= k, what(),
           ": FP8 GEMMs need k, lda and ldb multiples of 16 (16-byte rows), lda and ldb >= k");
  ST_CHECK(a.format == Fp8Format::kE4M3 || b.format == Fp8Format::kE4M3, what(),
           ": cuBLASLt has no E5M2 x E5M2 GEMM; one operand must be E4M3");
  ST_CHECK(a.per_row == b.per_row, what(),
           ": both operands' scales must be per row (cuBLASLt's outer-vector mode) or both per tensor");
  ST_CHECK(m == 0 || n == 0 || (a.codes && b.codes && a.inverse_scales && b.inverse_scales), what(),
           ": null codes or scales");
}

namespace {

// CBLAS dimensions are int: rows (m, tokens in the forward) go in chunks, n and k must fit.
constexpr int64_t kMaxRows = INT_MAX / 2;

// The value of every code, once per format.
const std::array<float, 256>& decode_table(Fp8Format f) {
  static const auto make = [](Fp8Format format) {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = fp8_decode(static_cast<uint8_t>(c), format);
    return t;
  };
  static const std::array<float, 256> e4m3 = make(Fp8Format::kE4M3), e5m2 = make(Fp8Format::kE5M2);
  return f == Fp8Format::kE4M3 ? e4m3 : e5m2;
}

// The operand's codes as floats, [rows, k] packed: exact (an FP8 value is a float with at most 4 significant bits).
std::vector<float> decode(const Fp8GemmOperand& x, int64_t rows, int64_t k) {
  const std::array<float, 256>& table = decode_table(x.format);
  std::vector<float> out(static_cast<size_t>(rows * k));
#pragma omp parallel for schedule(static) if (rows * k >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < k; ++c) out[static_cast<size_t>(r * k + c)] = table[x.codes[r * x.ld + c]];
  return out;
}

}  // namespace

void fp8_gemm(float* out, int64_t ldo, GradWrite write, const Fp8GemmOperand& a, const Fp8GemmOperand& b, int64_t m,
              int64_t n, int64_t k, const float* bias, const float* residual) {
  check_fp8_gemm(a, b, m, n, k, ldo);
  ST_CHECK(!residual || write == GradWrite::kOverwrite, describe_fp8_gemm(a, b, m, n, k, ldo),
           ": a residual replaces out's old value; it takes GradWrite::kOverwrite");
  if (m == 0 || n == 0) return;
  ST_CHECK(n <= INT_MAX && k <= INT_MAX, describe_fp8_gemm(a, b, m, n, k, ldo), ": n and k must fit in int");
  const std::vector<float> da = decode(a, m, k), db = decode(b, n, k);
  // The unscaled sums: products of two decoded codes (8 significant bits at most, exponents within float's range)
  // are exact, so this is fp32 accumulation of the exact products, as cuBLASLt computes them before its scales.
  std::vector<float> sums(static_cast<size_t>(m * n));
  for (int64_t r0 = 0; r0 < m; r0 += kMaxRows) {
    const int rows = static_cast<int>(std::min(kMaxRows, m - r0));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, static_cast<int>(n), static_cast<int>(k), 1.0f,
                da.data() + r0 * k, static_cast<int>(k), db.data(), static_cast<int>(k), 0.0f, sums.data() + r0 * n,
                static_cast<int>(n));
  }
  const float* c = residual ? residual : write == GradWrite::kAccumulate ? out : nullptr;  // the beta term
#pragma omp parallel for schedule(static) if (m * n >= kMinParallelWork)
  for (int64_t i = 0; i < m; ++i) {
    const double sa = a.inverse_scales[a.per_row ? i : 0];
    for (int64_t j = 0; j < n; ++j) {
      double v = static_cast<double>(sums[static_cast<size_t>(i * n + j)]) * sa *
                 static_cast<double>(b.inverse_scales[b.per_row ? j : 0]);
      if (c) v += static_cast<double>(c[i * ldo + j]);
      if (bias) v += static_cast<double>(bias[j]);
      out[i * ldo + j] = static_cast<float>(v);
    }
  }
}

}  // namespace st
