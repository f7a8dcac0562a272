#include "shardtrain/kernels/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "shardtrain/core/error.h"

namespace st {

namespace {

struct Format {
  int man_bits;      // mantissa bits
  int bias;          // exponent bias
  uint8_t max_code;  // the largest finite value's code, sign clear
  float max;
};

Format format(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? Format{3, 7, 0x7E, 448.0f} : Format{2, 15, 0x7B, 57344.0f};
}

}  // namespace

const char* to_string(Fp8Format f) { return f == Fp8Format::kE4M3 ? "e4m3" : "e5m2"; }

float fp8_max(Fp8Format f) { return format(f).max; }

uint8_t fp8_encode(float x, Fp8Format f) {
  const Format F = format(f);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= F.max) return sign | F.max_code;
  const int steps = 1 << F.man_bits;  // codes per binade
  const int min_exp = 1 - F.bias;     // the smallest normal's exponent
  int e = 0;
  std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): a's binade is 2^(e - 1)
  --e;
  // In units of the last place of a's binade (of the subnormals' below the smallest normal), rounded half to even:
  // every step is exact in double, and nearbyint rounds to even under the default rounding mode.
  const int binade = a == 0.0 ? min_exp : std::max(e, min_exp);
  const double ulps = std::nearbyint(std::ldexp(a, F.man_bits - binade));
  // Codes are ordered as the values: the subnormal range counts ulps from code 0, each normal binade from its first
  // code; a round-up to the next binade's first code falls out of the same sum.
  int64_t code = binade == min_exp && a < std::ldexp(1.0, min_exp)
                     ? static_cast<int64_t>(ulps)
                     : static_cast<int64_t>(binade - min_exp + 1) * steps + static_cast<int64_t>(ulps) - steps;
  if (code > F.max_code) code = F.max_code;
  return static_cast<uint8_t>(sign | code);
}

float fp8_decode(uint8_t code, Fp8Format f) {
  const Format F = format(f);
  const bool negative = (code & 0x80) != 0;
  const int bits = code & 0x7F;
  const int exp_field = bits >> F.man_bits, man = bits & ((1 << F.man_bits) - 1);
  const int exp_max = (1 << (7 - F.man_bits)) - 1;
  float v = 0.0f;
  if (f == Fp8Format::kE4M3 && bits == 0x7F) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (f == Fp8Format::kE5M2 && exp_field == exp_max) {
    v = man == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  } else if (exp_field == 0) {
    v = static_cast<float>(std::ldexp(static_cast<double>(man), 1 - F.bias - F.man_bits));
  } else {
    v = static_cast<float>(std::ldexp(static_cast<double>(man + (1 << F.man_bits)), exp_field - F.bias - F.man_bits));
  }
  return negative ? -v : v;
}

float fp8_scale(float amax, Fp8Format f, bool power_of_2) {
  const float scale = fp8_max(f) / std::max(amax, 1e-12f);
  if (!power_of_2) return scale;
  int e = 0;
  std::frexp(scale, &e);  // scale = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, e - 1);
}

void fp8_maxima(const float* x, int64_t rows, int64_t cols, Fp8Scaling scaling, unsigned* maxima,
                const std::string& what) {
  const int64_t n = rows * cols;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) ST_BAD_INPUT(what, ": element ", i, " is ", x[i], "; FP8 casts finite values only");
  std::vector<float> amax(static_cast<size_t>(fp8_groups(scaling, rows, cols)), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& m = amax[static_cast<size_t>(fp8_group(scaling, r, c))];
      m = std::max(m, std::fabs(x[r * cols + c]));
    }
  for (size_t g = 0; g < amax.size(); ++g) std::memcpy(&maxima[g], &amax[g], sizeof(float));
}

void fp8_fold_maximum(const float* x, int64_t n, unsigned* amax) {
  unsigned m = *amax;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    unsigned bits = 0;
    std::memcpy(&bits, &a, sizeof(bits));
    m = std::max(m, bits);
  }
  *amax = m;
}

void fp8_quantize_ahead(const float* x, int64_t rows, int64_t cols, Fp8Format f, const unsigned* amax, uint8_t* q,
                        uint8_t* q_t, float* inverse_scale, unsigned* own) {
  float m = 0.0f;
  std::memcpy(&m, amax, sizeof(m));
  // A non-finite maximum gives a NaN scale, every code NaN's, as the GPU's casts take it.
  const float scale = m == 0.0f ? 1.0f : std::isfinite(m) ? fp8_scale(m, f) : NAN;
  *inverse_scale = 1.0f / scale;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = x[r * cols + c];
      const uint8_t code = std::isfinite(v) && std::isfinite(scale) ? fp8_encode(v * scale, f) : uint8_t{0x7f};
      if (q != nullptr) q[r * cols + c] = code;
      if (q_t != nullptr) q_t[c * rows + r] = code;
    }
  if (own != nullptr) fp8_fold_maximum(x, rows * cols, own);
}

void fp8_quantize_with_maxima(const float* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling,
                              bool power_of_2, Fp8Layout layout, const unsigned* maxima, uint8_t* q,
                              float* inverse_scales) {
  std::vector<float> scale(static_cast<size_t>(fp8_groups(scaling, rows, cols)));
  for (size_t g = 0; g < scale.size(); ++g) {
    float amax = 0.0f;
    std::memcpy(&amax, &maxima[g], sizeof(float));
    scale[g] = fp8_scale(amax, f, power_of_2);
    inverse_scales[g] = 1.0f / scale[g];
  }
  const bool transposed = layout == Fp8Layout::kTransposed;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      q[transposed ? c * rows + r : r * cols + c] =
          fp8_encode(x[r * cols + c] * scale[static_cast<size_t>(fp8_group(scaling, r, c))], f);
}

void fp8_scales_of_parts(const unsigned* maxima, int world, int64_t k, Fp8Format f, bool power_of_2,
                         unsigned* out_maxima, float* inverse_scales) {
  for (int64_t t = 0; t < k; ++t) {
    unsigned m = 0;
    for (int r = 0; r < world; ++r) m = std::max(m, maxima[r * k + t]);  // the bits of |x| order as the values
    float amax = 0.0f;
    std::memcpy(&amax, &m, sizeof(float));
    out_maxima[t] = m;
    inverse_scales[t] = 1.0f / fp8_scale(amax, f, power_of_2);
  }
}

void fp8_transpose(const uint8_t* q, int64_t rows, int64_t cols, uint8_t* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = q[r * cols + c];
}

void fp8_quantize_matrix(const float* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling, bool power_of_2,
                         Fp8Layout layout, uint8_t* q, float* inverse_scales, const std::string& what) {
  std::vector<unsigned> maxima(static_cast<size_t>(fp8_groups(scaling, rows, cols)));
  fp8_maxima(x, rows, cols, scaling, maxima.data(), what);
  fp8_quantize_with_maxima(x, rows, cols, f, scaling, power_of_2, layout, maxima.data(), q, inverse_scales);
}

void fp8_quantize_pair(const float* x, int64_t rows, int64_t cols, bool power_of_2, const Fp8Cast& row_major,
                       const Fp8Cast& transposed, const std::string& what) {
  fp8_quantize_matrix(x, rows, cols, row_major.format, row_major.scaling, power_of_2, Fp8Layout::kRowMajor, row_major.q,
                      row_major.inverse_scales, what);
  fp8_quantize_matrix(x, rows, cols, transposed.format, transposed.scaling, power_of_2, Fp8Layout::kTransposed,
                      transposed.q, transposed.inverse_scales, what);
}

void fp8_quantize_pair_with_maxima(const float* x, int64_t rows, int64_t cols, bool power_of_2,
                                   const Fp8Cast& row_major, const Fp8Cast& transposed, const unsigned* maxima) {
  ST_CHECK(row_major.scaling == transposed.scaling, "fp8_quantize_pair_with_maxima: the casts group differently");
  fp8_quantize_with_maxima(x, rows, cols, row_major.format, row_major.scaling, power_of_2, Fp8Layout::kRowMajor, maxima,
                           row_major.q, row_major.inverse_scales);
  fp8_quantize_with_maxima(x, rows, cols, transposed.format, transposed.scaling, power_of_2, Fp8Layout::kTransposed,
                           maxima, transposed.q, transposed.inverse_scales);
}

void fp8_round_trip(const float* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling, bool power_of_2,
                    float* out, const std::string& what) {
  std::vector<uint8_t> q(static_cast<size_t>(rows * cols));
  std::vector<float> inverse(static_cast<size_t>(fp8_groups(scaling, rows, cols)));
  fp8_quantize_matrix(x, rows, cols, f, scaling, power_of_2, Fp8Layout::kRowMajor, q.data(), inverse.data(), what);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] =
          fp8_decode(q[static_cast<size_t>(r * cols + c)], f) * inverse[static_cast<size_t>(fp8_group(scaling, r, c))];
}

}  // namespace st
