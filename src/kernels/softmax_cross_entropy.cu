#include <cmath>
#include <type_traits>

#include "gpu_pack.cuh"
#include "shardtrain/kernels/gpu/softmax_cross_entropy.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

// 256 threads a row: several rows share an SM, so one row's loads overlap another's reductions and stores (at 1024,
// one block filled an SM and its phases ran one after another: 1.8 TB/s at GPT-2's vocabulary).
constexpr int kBlock = 256;

struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// exp for the loss and its gradient. Half-precision logits take the hardware exp2 (max relative error ~2^-21,
// far below their own rounding); fp32 logits keep expf for parity with the CPU reference.
template <typename T>
__device__ __forceinline__ float row_exp(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return expf(x);
  } else {
    return __expf(x);
  }
}

// One block per row. Each thread keeps an online (max, sum of exp) over its elements, by pack, so the row is
// read once for the loss and once more for the gradient. (A variant holding the row in registers, to read it
// only once, measured 46% slower on H200 with 1024-thread blocks: at one block per SM nothing overlapped its load,
// reduce and store phases. bench/RESULTS.md, 2026-11-29.)
template <int kVec, typename T>
__global__ void softmax_cross_entropy_kernel(float* losses, T* dlogits, const T* logits, const int32_t* targets,
                                             int64_t N, int V, int Vp, float dloss) {
  __shared__ float shared[kWarpSize];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* x = logits + n * Vp;
    const int tgt = targets[n];
    const bool valid = tgt >= 0 && tgt < V;
    // Read before the reductions' barriers, hence before any thread writes dlogits (which may alias x).
    const float x_tgt = valid ? to_f32(x[tgt]) : NAN;
    // Online softmax by pack: the running sum is rescaled only when a pack raises the running max.
    float m = -INFINITY, s = 0;
    for_each_pack<kVec>(V, threadIdx.x, blockDim.x, [&](int64_t i, auto w) {
      constexpr int W = decltype(w)::value;
      float v[W];
      load<W>(x + i, v);
      float pm = v[0];
      for (int k = 1; k < W; ++k) pm = fmaxf(pm, v[k]);
      if (pm > m) {
        s = m == -INFINITY ? 0.0f : s * row_exp<T>(m - pm);
        m = pm;
      }
      for (int k = 0; k < W; ++k) s += row_exp<T>(v[k] - m);
    });
    const float mx = block_reduce(m, Max(), shared);
    // A thread with no elements (V < blockDim) has m = -inf and contributes nothing.
    const float sum = block_reduce(m == -INFINITY ? 0.0f : s * row_exp<T>(m - mx), Add(), shared);
    if (threadIdx.x == 0) losses[n] = logf(sum) + mx - x_tgt;
    if (dlogits == nullptr) continue;
    T* d = dlogits + n * Vp;
    const float scale = dloss / sum;
    // In place, each element is read before the same thread writes it.
    for_each_pack<kVec>(V, threadIdx.x, blockDim.x, [&](int64_t i, auto w) {
      constexpr int W = decltype(w)::value;
      float v[W];
      load<W>(x + i, v);
      for (int k = 0; k < W; ++k) v[k] = row_exp<T>(v[k] - mx) * scale - (i + k == tgt ? dloss : 0.0f);
      store<W>(d + i, v);
    });
    for (int i = V + threadIdx.x; i < Vp; i += blockDim.x) d[i] = from_f32<T>(0.0f);
  }
}

}  // namespace

template <typename T>
void softmax_cross_entropy(float* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N, int V, int Vp,
                           float dloss, const GpuContext& ctx) {
  ST_CHECK(V > 0 && V <= Vp, "V = ", V, ", Vp = ", Vp);
  if (N == 0) return;
  constexpr int kVec = 16 / sizeof(T);
  // With Vp a multiple of kVec, aligned base pointers give aligned rows.
  const bool vec = Vp % kVec == 0 && all_aligned(16, logits, dlogits);
  launch_packed<T>(vec, [&](auto w) {
    softmax_cross_entropy_kernel<decltype(w)::value>
        <<<grid_for(N, 1), kBlock, 0, ctx.stream>>>(losses, dlogits, logits, targets, N, V, Vp, dloss);
  });
}

template void softmax_cross_entropy<float>(float*, float*, const float*, const int32_t*, int64_t, int, int, float,
                                           const GpuContext&);
template void softmax_cross_entropy<bf16>(float*, bf16*, const bf16*, const int32_t*, int64_t, int, int, float,
                                          const GpuContext&);
template void softmax_cross_entropy<fp16>(float*, fp16*, const fp16*, const int32_t*, int64_t, int, int, float,
                                          const GpuContext&);

}  // namespace st::gpu
