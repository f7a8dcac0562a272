// Test helpers shared by the kernel tests: random tensors, double-precision losses on float outputs,
// central finite differences and the relative error used by every gradient check.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "shardtrain/core/rng.h"

namespace st::testing {

// Fixed seed: every test draws its tensors from its own stream.
inline constexpr uint64_t kSeed = 20240611;

// Finite-difference checks: central differences with step kFdStep on the float kernel, the loss
// L = sum(out * R) summed in double, compared as max|analytic - fd| / max|fd| <= kFdTol.
// Error budget of the FD estimate itself, with inputs of scale ~1:
//   truncation  h^2 |L'''| / 6            ~ 2e-5 for h = 1e-2 (zero for the linear ops),
//   rounding    6e-8 * |terms of L| / 2h   ~ 1e-5 (each perturbation moves few outputs; L is in double).
// Measured worst case over all ops: 3.1e-5 (attention, the k slice), 2.2e-5 (cross-entropy), 1.5e-5
// (gelu, layernorm). 1e-3 keeps a 30x margin, while any wrong or missing term (a dropped mean term, a missing
// 1/sqrt(hs), a transposed product, a gradient leaking through the mask) is O(1e-1..1).
inline constexpr float kFdStep = 1e-2f;
inline constexpr double kFdTol = 1e-3;
// Float kernel against a double implementation of the definition, as max|diff| / max|ref|. The kernels' outputs are
// sums of at most 300 float32 terms of inputs of scale ~1 (u = 2^-24): random rounding grows as sqrt(n) u, 1e-6 at
// n = 300, and the worst case n u reaches 1e-5 at n = 168. 1e-5 holds for any summation order (every OpenBLAS core
// type passes: tests/numeric_per_coretype.sh), while a wrong term is O(1e-2..1).
inline constexpr double kRefTol = 1e-5;

inline std::vector<float> randn(int64_t n, uint64_t stream, float scale = 1.0f) {
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(normal_at(kSeed, stream, i)) * scale;
  return x;
}

// L = sum(out * r), accumulated in double so the only float error is in the kernel's outputs.
inline double weighted_sum(const float* out, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < r.size(); ++i) s += static_cast<double>(out[i]) * r[i];
  return s;
}

// dL/dx[i] by central differences, for every element of x. The divisor is the perturbation actually
// representable in float ((x+h) - (x-h) after rounding), not 2h. x is restored bit for bit.
template <typename Loss>
std::vector<double> numeric_grad(float* x, int64_t n, float h, Loss&& loss) {
  std::vector<double> g(n);
  for (int64_t i = 0; i < n; ++i) {
    const float x0 = x[i];
    x[i] = x0 + h;
    const float xp = x[i];
    const double lp = loss();
    x[i] = x0 - h;
    const float xm = x[i];
    const double lm = loss();
    x[i] = x0;
    g[i] = (lp - lm) / (static_cast<double>(xp) - static_cast<double>(xm));
  }
  return g;
}

inline double max_abs(const std::vector<double>& ref) {
  double m = 0;
  for (double v : ref) m = std::max(m, std::abs(v));
  return m;
}

// max |got - ref| / max |ref|: the error scaled by the tensor's own magnitude.
template <typename T>
double max_rel_diff(const T* got, const std::vector<double>& ref) {
  double d = 0;
  for (size_t i = 0; i < ref.size(); ++i) d = std::max(d, std::abs(static_cast<double>(got[i]) - ref[i]));
  const double m = max_abs(ref);
  return m > 0 ? d / m : d;
}

inline double max_rel_diff(const std::vector<float>& got, const std::vector<double>& ref) {
  return max_rel_diff(got.data(), ref);
}

inline std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

// Runs fn with the OpenMP thread count set to n, then restores the previous count.
template <typename Fn>
void with_threads(int n, Fn&& fn) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(n);
  fn();
  omp_set_num_threads(saved);
}

// run() returns a float vector: it must give the same bits under 1, 2 and 3 OpenMP threads.
template <typename Run>
void expect_same_bits_across_thread_counts(Run&& run) {
  std::vector<float> g[3];
  for (int t = 1; t <= 3; ++t) with_threads(t, [&] { g[t - 1] = run(); });
  EXPECT_EQ(0, std::memcmp(g[0].data(), g[1].data(), g[0].size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(g[0].data(), g[2].data(), g[0].size() * sizeof(float)));
}

}  // namespace st::testing
