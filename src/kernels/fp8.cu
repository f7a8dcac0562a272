#include "shardtrain/kernels/gpu/fp8.h"

#include <cuda_fp8.h>

#include <climits>

#include "gpu_pack.cuh"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

// Every float step is an explicit round-to-nearest intrinsic (and this file is built with -fmad=false -ftz=false,
// CMakeLists.txt), so that the codes and scales are the CPU reference's bits.

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t group_of(Fp8Scaling s, int64_t i, int64_t cols) {
  return s == Fp8Scaling::kTensor ? 0 : s == Fp8Scaling::kRow ? i / cols : i % cols;
}

// Each element's magnitude into its group's maximum (atomicMax on the bits: the bits of non-negative floats order as
// the floats), and the lowest index of a non-finite element.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const T* x, int64_t n, int64_t cols, Fp8Scaling s, unsigned* amax_bits, unsigned long long* first_bad) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    const float v = to_f32(x[i]);
    if (!isfinite(v)) {
      atomicMin(first_bad, static_cast<unsigned long long>(i));
      continue;
    }
    atomicMax(amax_bits + group_of(s, i, cols), __float_as_uint(fabsf(v)));
  }
}

// st::fp8_scale's steps per group, and its inverse for the GEMM.
__global__ void scale_kernel(const unsigned* amax_bits, int64_t groups, float fp8_max, bool power_of_2, float* scale,
                             float* inverse) {
  for (int64_t g = thread_index(); g < groups; g += thread_count()) {
    float sc = __fdiv_rn(fp8_max, fmaxf(__uint_as_float(amax_bits[g]), 1e-12f));
    if (power_of_2) sc = __uint_as_float(__float_as_uint(sc) & 0xFF800000u);  // a normal float: its power of two
    scale[g] = sc;
    inverse[g] = __fdiv_rn(1.0f, sc);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) cast_kernel(const T* x, int64_t n, int64_t cols, Fp8Scaling s,
                                                        const float* scale, __nv_fp8_interpretation_t format,
                                                        uint8_t* q) {
  for (int64_t i = thread_index(); i < n; i += thread_count())
    q[i] = __nv_cvt_float_to_fp8(__fmul_rn(to_f32(x[i]), scale[group_of(s, i, cols)]), __NV_SATFINITE, format);
}

}  // namespace

template <typename T>
void fp8_quantize_matrix(const T* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling, bool power_of_2,
                         uint8_t* q, float* inverse_scales, const std::string& what, const GpuContext& ctx) {
  const int64_t n = rows * cols, groups = fp8_groups(scaling, rows, cols);
  ST_CHECK(rows >= 0 && cols >= 0, "gpu::fp8_quantize_matrix: ", rows, " x ", cols);
  ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= fp8_quantize_scratch_bytes(groups),
           "gpu::fp8_quantize_matrix needs ", fp8_quantize_scratch_bytes(groups), " bytes of scratch, ctx has ",
           ctx.scratch_bytes);
  if (n == 0) return;
  // Scratch as fp8_quantize_scratch_bytes lays it out.
  auto* first_bad = static_cast<unsigned long long*>(ctx.scratch);
  auto* amax_bits = reinterpret_cast<unsigned*>(first_bad + 1);
  auto* scale = reinterpret_cast<float*>(amax_bits + groups);
  ST_CUDA_CHECK(cudaMemsetAsync(first_bad, 0xff, sizeof(*first_bad), ctx.stream));  // ULLONG_MAX: none yet
  ST_CUDA_CHECK(cudaMemsetAsync(amax_bits, 0, static_cast<size_t>(groups) * sizeof(unsigned), ctx.stream));
  const unsigned grid = grid_for(n, kThreads);
  amax_kernel<T><<<grid, kThreads, 0, ctx.stream>>>(x, n, cols, scaling, amax_bits, first_bad);
  ST_CUDA_CHECK_LAUNCH();
  scale_kernel<<<grid_for(groups, kThreads), kThreads, 0, ctx.stream>>>(amax_bits, groups, fp8_max(f), power_of_2,
                                                                       scale, inverse_scales);
  ST_CUDA_CHECK_LAUNCH();
  cast_kernel<T><<<grid, kThreads, 0, ctx.stream>>>(x, n, cols, scaling, scale,
                                                    f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2, q);
  ST_CUDA_CHECK_LAUNCH();
  // One wait: a non-finite activation or gradient surfaces here, named, not as a NaN loss steps later.
  unsigned long long bad = 0;
  ST_CUDA_CHECK(cudaMemcpyAsync(&bad, first_bad, sizeof(bad), cudaMemcpyDeviceToHost, ctx.stream));
  ST_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  if (bad == ULLONG_MAX) return;
  ST_BAD_INPUT(what, ": element ", bad, " is ", element_on_host(x, static_cast<int64_t>(bad)),
               "; FP8 casts finite values only");
}

template void fp8_quantize_matrix<float>(const float*, int64_t, int64_t, Fp8Format, Fp8Scaling, bool, uint8_t*, float*,
                                         const std::string&, const GpuContext&);
template void fp8_quantize_matrix<bf16>(const bf16*, int64_t, int64_t, Fp8Format, Fp8Scaling, bool, uint8_t*, float*,
                                        const std::string&, const GpuContext&);

}  // namespace st::gpu
