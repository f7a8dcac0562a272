// Shared by the kernels' GPU tests (*_gpu_test.cc): the activation types with their tolerances, the
// comparison rule against the CPU reference, integer uploads, a stream + scratch + context, and the checks of a
// producer kernel's amax output.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../common/gpu_test.h"
#include "grad_check.h"
#include "maximum_check.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/gpu/fp8.h"

namespace st::test {

using ActivationTypes = ::testing::Types<float, bf16, fp16>;
struct ActivationNames {
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, float> ? "float" : (std::is_same_v<T, bf16> ? "bf16" : "fp16");
  }
};

// Relative tolerance against the fp32 CPU reference run on the same (T-rounded) operands: fp32 outputs
// differ only by summation order and a few ulps of exp; bf16 outputs are rounded once (relative 2^-9),
// fp16 ones too (2^-12; 1e-2 also covers rounded intermediates such as attention's scores).
template <typename T>
inline constexpr double kTol = std::is_same_v<T, float> ? 1e-5 : 1e-2;

// all_close with relative tolerance rtol and a floor of a tenth of max|want|: many outputs are sums of
// terms of either sign (accumulated gradients, x*w + b), whose rounding error scales with the terms rather
// than with a result that may be near zero. A wrong or missing term still shows as an O(1) error.
inline ::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want, double rtol) {
  float amax = 0;
  for (float w : want) amax = std::max(amax, std::fabs(w));
  return all_close(got, want, rtol, 0.1 * amax);
}

// Bit-for-bit equality, for determinism checks.
inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// n standard normals * scale + shift, rounded through T so the CPU reference sees the GPU's operands.
template <typename T>
std::vector<float> random_input(int64_t n, uint64_t stream, float scale = 1.0f, float shift = 0.0f) {
  std::vector<float> x = ::st::testing::randn(n, stream, scale);
  for (float& v : x) v += shift;
  return round_through<T>(std::move(x));
}

// n integers uniform in [0, hi).
inline std::vector<int32_t> random_ints(int64_t n, int hi, uint64_t stream) {
  Rng rng(::st::testing::kSeed, stream);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = static_cast<int32_t>(rng.next_below(hi));
  return v;
}

// x on the device after `offset` elements of padding (offset 1 misaligns the kernel's pointers, to reach
// the scalar paths), and back: download returns the elements after the padding.
template <typename T>
DeviceBuffer<T> upload(const std::vector<float>& x, int offset) {
  std::vector<float> padded(offset, 1.0f);
  padded.insert(padded.end(), x.begin(), x.end());
  return to_device<T>(padded);
}
template <typename T>
std::vector<float> download(const DeviceBuffer<T>& d, int offset) {
  const std::vector<float> x = to_host(d);
  return std::vector<float>(x.begin() + offset, x.end());
}

template <typename I>
DeviceBuffer<I> ints_to_device(const std::vector<I>& host) {
  DeviceBuffer<I> d(static_cast<int64_t>(host.size()));
  ST_CUDA_CHECK(cudaMemcpy(d.data(), host.data(), d.bytes(), cudaMemcpyHostToDevice));
  ST_CUDA_CHECK(cudaDeviceSynchronize());  // see to_device in tests/common/gpu_test.h
  return d;
}

// And back, once the device is idle.
template <typename I>
std::vector<I> ints_to_host(const DeviceBuffer<I>& d) {
  ST_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<I> v(static_cast<size_t>(d.size()));
  ST_CUDA_CHECK(cudaMemcpy(v.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost));
  return v;
}

// A producer kernel's optional amax output (kernels/gpu/rmsnorm.h, ...) on the device: one maximum, zeroed; bits()
// reads it back once the device is idle.
struct DeviceMaximum {
  DeviceBuffer<unsigned> at = ints_to_device(std::vector<unsigned>{0});
  unsigned* data() { return at.data(); }
  unsigned bits() const {
    ST_CUDA_CHECK(cudaDeviceSynchronize());
    unsigned b = 0;
    ST_CUDA_CHECK(cudaMemcpy(&b, at.data(), sizeof(b), cudaMemcpyDeviceToHost));
    return b;
  }
};

// A producer's amax against what it must hold: bit for bit, the tensorwise maximum fp8_maxima takes of `written`
// (the kernel's output as stored, downloaded: finite); and, within rtol, the CPU reference's amax `cpu` over its own
// output.
inline ::testing::AssertionResult maximum_matches(unsigned got, const std::vector<float>& written, unsigned cpu,
                                                  double rtol) {
  const unsigned want = ::st::testing::tensor_maximum(written);
  if (got != want)
    return ::testing::AssertionFailure() << "amax bits " << std::hex << got << ", the output's maximum " << want;
  float g = 0, c = 0;
  std::memcpy(&g, &got, sizeof(g));
  std::memcpy(&c, &cpu, sizeof(c));
  if (!(std::fabs(g - c) <= rtol * c))
    return ::testing::AssertionFailure() << "amax " << g << ", the CPU reference's " << c << " (rtol " << rtol << ")";
  return ::testing::AssertionSuccess();
}

// gpu::fp8_maxima_async's tensorwise maximum of x [n] (T float or bf16, the types FP8 casts read), as bits: what a
// producer's amax must equal, non-finite values included.
template <typename T>
unsigned device_maximum(const T* x, int64_t n, const gpu::GpuContext& ctx) {
  DeviceMaximum m;
  gpu::fp8_maxima_async<T>(x, 1, n, Fp8Scaling::kTensor, m.data(), ctx);
  return m.bits();
}

// Bits at or above an infinity's: a non-finite maximum.
inline bool non_finite_bits(unsigned bits) { return bits >= 0x7f800000u; }

// A stream, `scratch_bytes` of scratch and the context over them. Construct after ST_SKIP_WITHOUT_GPU.
struct GpuEnv {
  explicit GpuEnv(size_t scratch_bytes = 0)
      : scratch(static_cast<int64_t>(scratch_bytes)), ctx{stream.get(), nullptr, scratch.data(), scratch.bytes()} {}
  CudaStream stream;
  DeviceBuffer<unsigned char> scratch;
  gpu::GpuContext ctx;
};

// The unfused path a fused FP8 producer replaces (gpu::swiglu_forward_fp8, gpu::rmsnorm_forward_fp8, ...): the tensor
// it would write, `written` [rows, cols] on the device, cast with the maximum `given` by
// gpu::fp8_quantize_pair_with_maxima_async: codes in both layouts and the inverse scale, on the host.
template <typename T>
struct UnfusedCast {
  UnfusedCast(const T* written, int64_t rows, int64_t cols, Fp8Format f, unsigned given, GpuEnv& env) {
    const int64_t n = rows * cols;
    const DeviceBuffer<unsigned> amax = ints_to_device(std::vector<unsigned>{given});
    DeviceBuffer<uint8_t> dq(n), dq_t(n);
    DeviceBuffer<float> inv(2);
    gpu::fp8_quantize_pair_with_maxima_async<T>(
        written, rows, cols, false, Fp8Cast{f, Fp8Scaling::kTensor, dq.data(), inv.data()},
        Fp8Cast{f, Fp8Scaling::kTensor, dq_t.data(), inv.data() + 1}, amax.data(), env.ctx);
    q = ints_to_host(dq);
    q_t = ints_to_host(dq_t);
    inverse = ints_to_host(inv)[0];
  }
  std::vector<uint8_t> q, q_t;
  float inverse = 0;
};

// How many of the CPU's codes lie more than one step from the GPU's (got, after `offset` bytes): codes order as their
// magnitudes within a sign.
inline int64_t codes_over_a_step_apart(const std::vector<uint8_t>& cpu, const std::vector<uint8_t>& got, int offset) {
  const auto ordinal = [](uint8_t c) { return (c & 0x80) != 0 ? -(c & 0x7f) : (c & 0x7f); };
  int64_t apart = 0;
  for (size_t i = 0; i < cpu.size(); ++i)
    if (std::abs(ordinal(cpu[i]) - ordinal(got[static_cast<size_t>(offset) + i])) > 1) ++apart;
  return apart;
}

}  // namespace st::test
