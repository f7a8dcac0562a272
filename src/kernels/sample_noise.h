// Private to src/kernels/sample.cc and sample.cu: the Gumbel noise of a draw and the order of logits, the same bit for
// bit on the host and in a kernel.
//
// The noise uses only operations IEEE 754 rounds exactly (+, -, *, / in double, comparisons, bit casts), so any
// conforming host or device computes the same double; libm's log and CUDA's log are each accurate to an ulp or so,
// but not the same ulp. Both files are compiled without contraction into fused multiply-adds (CMakeLists.txt), which
// would change the roundings on one side only.
#pragma once

#include <cstdint>
#include <cstring>

#include "shardtrain/core/host_device.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/kernels/sample.h"

namespace st::kernels_internal {

// The bits of `from` as a To of the same size (std::bit_cast, which C++17 lacks; CUDA compiles the copy to a move).
template <typename To, typename From>
ST_HOST_DEVICE inline To bits_as(From from) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To to;
  memcpy(&to, &from, sizeof(to));
  return to;
}

// ln x for a positive normal double x, within a few ulp: x = 2^e m with m in [sqrt(1/2), sqrt(2)), and ln m =
// 2 atanh(s) with s = (m - 1) / (m + 1), |s| < 0.172, by its series to s^23 (the rest is below 2^-60 of the sum).
// m - 1 is exact, so a result near 0 keeps its relative precision.
ST_HOST_DEVICE inline double sample_log(double x) {
  constexpr double kSqrt2 = 1.4142135623730951;
  // fdlibm's split of ln 2: kLn2Hi's low 32 bits are zero, so e * kLn2Hi is exact.
  constexpr double kLn2Hi = 6.93147180369123816490e-01;
  constexpr double kLn2Lo = 1.90821492927058770002e-10;
  const uint64_t b = bits_as<uint64_t>(x);
  int e = static_cast<int>(b >> 52) - 1023;
  double m = bits_as<double>((b & 0x000FFFFFFFFFFFFFull) | 0x3FF0000000000000ull);  // [1, 2)
  if (m > kSqrt2) {
    m *= 0.5;
    ++e;
  }
  const double f = m - 1.0;
  const double s = f / (2.0 + f);
  const double z = s * s;
  const double p =
      1.0 + z * (1.0 / 3 +
                 z * (1.0 / 5 +
                      z * (1.0 / 7 +
                           z * (1.0 / 9 +
                                z * (1.0 / 11 +
                                     z * (1.0 / 13 +
                                          z * (1.0 / 15 +
                                               z * (1.0 / 17 + z * (1.0 / 19 + z * (1.0 / 21 + z * (1.0 / 23)))))))))));
  const double de = static_cast<double>(e);
  return de * kLn2Hi + (de * kLn2Lo + 2.0 * s * p);
}

// sample_noise (kernels/sample.h): u in [2^-53, 1 - 2^-53], never 0 or 1, so both logs see a positive normal.
ST_HOST_DEVICE inline double gumbel_noise(uint64_t seed, uint64_t index) {
  const uint64_t bits = random_bits_at(seed, kSampleStream, index) >> 12;
  const double u = (static_cast<double>(bits) + 0.5) * (1.0 / 4503599627370496.0);  // 2^-52
  return -sample_log(-sample_log(u));
}

// A logit's place in the order of floats as an unsigned integer: larger floats give larger keys, -0 the key of +0
// (they compare equal), NaNs and infinities whatever (a row holding one has no token).
ST_HOST_DEVICE inline uint32_t logit_key(float v) {
  uint32_t b = bits_as<uint32_t>(v);
  if (b == 0x80000000u) b = 0;
  return (b & 0x80000000u) != 0 ? ~b : b | 0x80000000u;
}

// A candidate's score: its logit plus the temperature times its noise (softmax(logit / T) as a Gumbel argmax, scaled
// by T > 0; a tiny T leaves the logits' order alone).
ST_HOST_DEVICE inline double sample_score(float logit, double temperature, uint64_t seed, uint64_t index) {
  return static_cast<double>(logit) + temperature * gumbel_noise(seed, index);
}

// Whether (score, id) beats (best, best_id): the larger score, then the lower id.
ST_HOST_DEVICE inline bool sample_better(double score, int id, double best, int best_id) {
  return score > best || (score == best && id < best_id);
}

}  // namespace st::kernels_internal
