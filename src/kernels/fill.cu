#include "shardtrain/kernels/gpu/fill.h"

#include <algorithm>

#include "gpu_pack.cuh"
#include "shardtrain/core/rng.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

template <typename T>
__global__ void fill_uniform_kernel(T* out, int64_t n, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = from_f32<T>(uniform_pm1_at(seed, static_cast<uint64_t>(i)));
}

}  // namespace

template <typename T>
void fill_uniform(T* out, int64_t n, uint64_t seed, const GpuContext& ctx) {
  if (n <= 0) return;
  constexpr int kThreads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
  fill_uniform_kernel<<<blocks, kThreads, 0, ctx.stream>>>(out, n, seed);
  ST_CUDA_CHECK_LAUNCH();
}

template void fill_uniform<float>(float*, int64_t, uint64_t, const GpuContext&);
template void fill_uniform<bf16>(bf16*, int64_t, uint64_t, const GpuContext&);
template void fill_uniform<fp16>(fp16*, int64_t, uint64_t, const GpuContext&);

}  // namespace st::gpu
