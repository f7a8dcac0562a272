// Private to src/kernels: an inline, vectorisable expf for the element-wise hot loops (softmax, GELU).
//
// libm's expf/tanhf are opaque calls that keep GCC from vectorising a loop unless -ffast-math is on,
// and they dominated GELU and the cross-entropy. This is Cephes' expf: range reduction by ln 2 (split in
// two parts), a degree-6 polynomial and 2^n built in the exponent bits; max relative error 1.4 ulp on
// [-87, 88] (tests/kernels/vec_math_test.cc). Use:
//
//   const ExpRange er = exp_range();                 // once, outside the loop
//   #pragma omp simd
//   for (...) y[i] = exp_fast(x[i], er);
#pragma once

#include <cstdint>
#include <cstring>

namespace st::kernels_internal {

// The clamp bounds of exp_fast. They come through an empty asm so the compiler cannot see them as
// constants: if it could, it would split the loop on "x is clamped", fold that path to a constant and
// leave a branch that (under the default -ftrapping-math) stops the vectoriser.
struct ExpRange {
  float lo, hi;
};
inline ExpRange exp_range() {
  float lo = -87.0f, hi = 88.0f;
  asm("" : "+r"(lo), "+r"(hi));
  return {lo, hi};
}

// e^x, x clamped to [-87, 88] first: below -87 it returns e^-87 ~ 1.6e-38 instead of something smaller
// (negligible next to any softmax sum, which is >= 1, and 1 + 1.6e-38 == 1 in GELU); above 88, e^88.
// -inf gives e^-87, +inf e^88, NaN stays NaN.
inline float exp_fast(float x, ExpRange b) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // kLn2Hi has 9 bits: n * kLn2Hi is exact
  constexpr float kRound = 12582912.0f;                             // 1.5 * 2^23: adding it rounds to an integer
  constexpr int32_t kRoundBits = 0x4B400000;                        // bit pattern of kRound
  const float xc = x < b.lo ? b.lo : (x > b.hi ? b.hi : x);
  const float t = xc * kLog2e + kRound;  // the low mantissa bits of t hold n = round(x / ln 2)
  const float n = t - kRound;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;  // |r| <= ln2 / 2
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * (r * r) + r + 1.0f;  // e^r
  int32_t tb;
  std::memcpy(&tb, &t, sizeof(tb));
  const int32_t scale_bits = (tb - kRoundBits + 127) << 23;  // 2^n, n in [-126, 127]
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof(scale));
  return er * scale;
}

}  // namespace st::kernels_internal
