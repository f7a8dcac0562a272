#include "shardtrain/kernels/gpu/argmax.h"

#include "gpu_pack.cuh"
#include "shardtrain/core/error.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

constexpr int kThreads = 1024;

// (value, id) pairs: the larger value wins, then the lower id; a non-finite logit makes the row's answer -1.
__device__ inline bool better(float v, int i, float best, int best_i) { return v > best || (v == best && i < best_i); }

template <typename T>
__global__ void __launch_bounds__(kThreads) argmax_kernel(const T* logits, int64_t ld, int V, int32_t* tokens) {
  __shared__ float values[kThreads];
  __shared__ int ids[kThreads];
  __shared__ int bad;
  allow_dependents();
  wait_for_predecessor();  // launched by launch_after_predecessor
  const T* row = logits + blockIdx.x * ld;
  const int tid = threadIdx.x;
  if (tid == 0) bad = 0;
  __syncthreads();
  float best = -INFINITY;
  int best_i = V;  // none yet: any finite value wins
  for (int i = tid; i < V; i += kThreads) {
    const float v = to_f32(row[i]);
    if (!isfinite(v)) bad = 1;
    if (better(v, i, best, best_i)) best = v, best_i = i;
  }
  values[tid] = best;
  ids[tid] = best_i;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (tid < half && better(values[tid + half], ids[tid + half], values[tid], ids[tid])) {
      values[tid] = values[tid + half];
      ids[tid] = ids[tid + half];
    }
    __syncthreads();
  }
  if (tid == 0) tokens[blockIdx.x] = bad ? -1 : ids[0];
}

}  // namespace

template <typename T>
void argmax_rows(const T* logits, int64_t ld, int rows, int V, int32_t* tokens, const GpuContext& ctx) {
  ST_CHECK(rows >= 0 && V >= 1 && ld >= V, "argmax of ", rows, " rows of ", V, " logits with a row stride of ", ld);
  if (rows == 0) return;
  launch_after_predecessor(argmax_kernel<T>, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, ctx.stream, logits,
                           ld, V, tokens);
}

template void argmax_rows<float>(const float*, int64_t, int, int, int32_t*, const GpuContext&);
template void argmax_rows<bf16>(const bf16*, int64_t, int, int, int32_t*, const GpuContext&);
template void argmax_rows<fp16>(const fp16*, int64_t, int, int, int32_t*, const GpuContext&);

}  // namespace st::gpu
