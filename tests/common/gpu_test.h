// Helpers for GPU tests: skip (never pass) without a device, copy vectors to and from the device, and
// round to bf16 or fp16 on the host so a CPU reference sees exactly the GPU's operands.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "shardtrain/core/cuda.h"

// Marks the test skipped, with the reason, when no CUDA device is visible (ctest reports it skipped).
#define ST_SKIP_WITHOUT_GPU()                                                       \
  do {                                                                              \
    if (::st::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device visible";    \
  } while (0)

namespace st::test {

// T is float, bf16 or fp16; float -> T rounds to nearest even, as the kernels do.
template <typename T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return __float2bfloat16_rn(x);
  } else {
    static_assert(std::is_same_v<T, fp16>, "T must be float, bf16 or fp16");
    return __float2half_rn(x);
  }
}
template <typename T>
float to_float(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, bf16>) {
    return __bfloat162float(x);
  } else {
    static_assert(std::is_same_v<T, fp16>, "T must be float, bf16 or fp16");
    return __half2float(x);
  }
}

// Rounds every element through T (a no-op for float), so the CPU reference runs on the GPU's operands.
template <typename T>
std::vector<float> round_through(std::vector<float> v) {
  for (float& x : v) x = to_float<T>(from_float<T>(x));
  return v;
}

template <typename T>
DeviceBuffer<T> to_device(const std::vector<float>& host) {
  std::vector<T> t(host.size());
  for (size_t i = 0; i < host.size(); ++i) t[i] = from_float<T>(host[i]);
  DeviceBuffer<T> d(static_cast<int64_t>(host.size()));
  ST_CUDA_CHECK(cudaMemcpy(d.data(), t.data(), d.bytes(), cudaMemcpyHostToDevice));
  // A pageable-memory cudaMemcpy may return before the DMA lands; kernels on a non-blocking stream
  // would not be ordered after it.
  ST_CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}

template <typename T>
std::vector<float> to_host(const DeviceBuffer<T>& d) {
  ST_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<T> t(static_cast<size_t>(d.size()));
  ST_CUDA_CHECK(cudaMemcpy(t.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost));
  std::vector<float> out(t.size());
  for (size_t i = 0; i < t.size(); ++i) out[i] = to_float<T>(t[i]);
  return out;
}

// Fills a device buffer with a NaN pattern so an element the kernel fails to write shows up.
template <typename T>
void poison(DeviceBuffer<T>& d) {
  ST_CUDA_CHECK(cudaMemset(d.data(), 0xFF, d.bytes()));
  ST_CUDA_CHECK(cudaDeviceSynchronize());
}

// Element-wise comparison: |got - want| <= rtol * max(|want|, floor) for every element, where floor
// (default: 1e-3 of the largest |want|) keeps near-zero elements from demanding absolute exactness.
// Reports the worst element. NaN never passes.
inline ::testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<float>& want,
                                            double rtol, double floor = -1) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != " << want.size();
  double amax = 0;
  for (float w : want) amax = std::max(amax, std::fabs(static_cast<double>(w)));
  if (floor < 0) floor = 1e-3 * amax;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double rel = err / std::max(std::fabs(static_cast<double>(want[i])), std::max(floor, 1e-30));
    if (!(rel <= worst) || std::isnan(got[i])) {
      worst = std::isnan(got[i]) ? INFINITY : rel;
      at = i;
    }
  }
  if (worst <= rtol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << ": got " << got[at] << ", want " << want[at]
                                       << " (relative error " << worst << " > " << rtol << ", floor " << floor
                                       << ")";
}

}  // namespace st::test
