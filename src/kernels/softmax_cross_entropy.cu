#include <algorithm>
#include <cmath>
#include <mutex>
#include <type_traits>
#include <vector>

#include "gpu_pack.cuh"
#include "shardtrain/kernels/gpu/softmax_cross_entropy.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

// 256 threads a row: several rows share an SM, so one row's loads overlap another's reductions and stores (at 1024,
// one block filled an SM and its phases ran one after another: 1.8 TB/s at GPT-2's vocabulary).
constexpr int kBlock = 256;

// The one-read kernel's blocks, and how many of them an SM must hold for a row to take that kernel. A row read
// once into registers by 1024-thread blocks ran 46% slower than reading it twice (bench/RESULTS.md, 2026-11-29):
// one block filled an SM, so its load, reductions and store ran one after another. Staged in shared memory, a
// 100 KB row (bf16 at GPT-2's vocabulary) leaves room for a second block in an H100/H200 SM's 228 KB, so one row's
// load can overlap the other's reductions and stores; a row with no room for two takes the fallback. At 512
// threads two blocks may take 64 registers a thread (at 1024, 32): room for kSmemLoads packs in flight each.
constexpr int kSmemBlock = 512;
constexpr int kSmemBlocksPerSm = 2;
constexpr int kSmemLoads = 4;

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

// Adds W logits to a thread's online (max, sum of exp): the running sum is rescaled only when they raise the
// running max.
template <typename T, int W>
__device__ __forceinline__ void online_add(const float (&v)[W], float& m, float& s) {
  float pm = v[0];
  for (int k = 1; k < W; ++k) pm = fmaxf(pm, v[k]);
  if (pm > m) {
    s = m == -INFINITY ? 0.0f : s * row_exp<T>(m - pm);
    m = pm;
  }
  for (int k = 0; k < W; ++k) s += row_exp<T>(v[k] - m);
}

// The fallback, for rows too wide for softmax_cross_entropy_smem_kernel or not packed: one block per row. Each
// thread keeps an online (max, sum of exp) over its elements, by pack, so the row is read once for the loss and
// once more for the gradient.
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
    float m = -INFINITY, s = 0;
    for_each_pack<kVec>(V, threadIdx.x, blockDim.x, [&](int64_t i, auto w) {
      constexpr int W = decltype(w)::value;
      float v[W];
      load<W>(x + i, v);
      online_add<T>(v, m, s);
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

// Dynamic shared memory of softmax_cross_entropy_smem_kernel: the reductions' 32 floats, then (with dlogits) the
// packs that hold [0, V).
template <typename T>
size_t smem_bytes(int V, bool with_row) {
  constexpr int kVec = 16 / sizeof(T);
  const size_t packs = (static_cast<size_t>(V) + kVec - 1) / kVec;
  return kWarpSize * sizeof(float) + (with_row ? packs * sizeof(Pack<T, kVec>) : 0);
}

// The row read once: one block per row, packed (Vp % kVec == 0). Each thread loads its packs (kSmemLoads in flight)
// into shared memory and its online (max, sum of exp); after the block's reductions it writes the gradient from
// the packs it staged itself (the same packs, so no barrier guards them) and zeros [V, Vp). In place, every read
// of the row precedes the reductions' barriers, hence every write. Without dlogits nothing is staged, and the
// losses are those with dlogits, bit for bit.
template <int kVec, typename T>
__global__ void __launch_bounds__(kSmemBlock, kSmemBlocksPerSm)
    softmax_cross_entropy_smem_kernel(float* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N,
                                      int V, int Vp, float dloss) {
  using P = Pack<T, kVec>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* shared = reinterpret_cast<float*>(smem);
  P* row = reinterpret_cast<P*>(smem + kWarpSize * sizeof(float));
  const int full = V / kVec;                // packs wholly in [0, V)
  const int packs = (V + kVec - 1) / kVec;  // and the partial one at V, if any
  const int tail = full % kSmemBlock;       // the thread that owns it
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const P* x = reinterpret_cast<const P*>(logits + n * Vp);
    const int tgt = targets[n];
    const bool valid = tgt >= 0 && tgt < V;
    const float x_tgt = valid ? to_f32(logits[n * Vp + tgt]) : NAN;
    float m = -INFINITY, s = 0;
    for (int p0 = threadIdx.x; p0 < full; p0 += kSmemLoads * kSmemBlock) {
      P pk[kSmemLoads];
#pragma unroll
      for (int u = 0; u < kSmemLoads; ++u) {
        const int p = p0 + u * kSmemBlock;
        if (p < full) pk[u] = x[p];
      }
#pragma unroll
      for (int u = 0; u < kSmemLoads; ++u) {
        const int p = p0 + u * kSmemBlock;
        if (p < full) {
          if (dlogits != nullptr) row[p] = pk[u];
          float v[kVec];
#pragma unroll
          for (int k = 0; k < kVec; ++k) v[k] = to_f32(pk[u].v[k]);
          online_add<T>(v, m, s);
        }
      }
    }
    if (packs > full && threadIdx.x == tail) {
      // Its elements past V are padding (within the row, as Vp % kVec == 0) and never enter the loss.
      const P pk = x[full];
      if (dlogits != nullptr) row[full] = pk;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float v[1] = {to_f32(pk.v[k])};
        if (full * kVec + k < V) online_add<T>(v, m, s);
      }
    }
    const float mx = block_reduce(m, Max(), shared);
    const float sum = block_reduce(m == -INFINITY ? 0.0f : s * row_exp<T>(m - mx), Add(), shared);
    if (threadIdx.x == 0) losses[n] = logf(sum) + mx - x_tgt;
    if (dlogits == nullptr) continue;
    P* d = reinterpret_cast<P*>(dlogits + n * Vp);
    const float scale = dloss / sum;
    for (int p = threadIdx.x; p < Vp / kVec; p += kSmemBlock) {
      const int i = p * kVec;
      float v[kVec];
      if (p < full) {
#pragma unroll
        for (int k = 0; k < kVec; ++k)
          v[k] = row_exp<T>(to_f32(row[p].v[k]) - mx) * scale - (i + k == tgt ? dloss : 0.0f);
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k)
          v[k] = p < packs && i + k < V ? row_exp<T>(to_f32(row[p].v[k]) - mx) * scale - (i + k == tgt ? dloss : 0.0f)
                                        : 0.0f;
      }
      P pk;
#pragma unroll
      for (int k = 0; k < kVec; ++k) pk.v[k] = from_f32<T>(v[k]);
      d[p] = pk;
    }
  }
}

// The most dynamic shared memory a block of softmax_cross_entropy_smem_kernel<T> may take on the current device
// with kSmemBlocksPerSm of them on an SM (H100/H200: 113 KB). Asked once a device, when the kernel is allowed it.
template <typename T>
size_t smem_capacity() {
  static std::mutex mu;
  static std::vector<int64_t> capacity;  // by device; -1 until asked
  int device = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mu);
  if (static_cast<size_t>(device) >= capacity.size()) capacity.resize(device + 1, -1);
  if (capacity[device] < 0) {
    int per_block = 0, per_sm = 0, reserved = 0;
    ST_CUDA_CHECK(cudaDeviceGetAttribute(&per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    ST_CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    ST_CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device));
    const int64_t cap = std::max<int64_t>(0, std::min<int64_t>(per_block, per_sm / kSmemBlocksPerSm - reserved));
    const auto kernel = softmax_cross_entropy_smem_kernel<16 / sizeof(T), T>;
    ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(cap)));
    ST_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    capacity[device] = cap;
  }
  return static_cast<size_t>(capacity[device]);
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
  // The path depends on the shape, the alignment and the device, not on whether dlogits is given: the losses
  // without it are the same bits.
  if (vec && smem_bytes<T>(V, true) <= smem_capacity<T>()) {
    softmax_cross_entropy_smem_kernel<kVec>
        <<<grid_for(N, 1), kSmemBlock, smem_bytes<T>(V, dlogits != nullptr), ctx.stream>>>(losses, dlogits, logits,
                                                                                           targets, N, V, Vp, dloss);
    ST_CUDA_CHECK_LAUNCH();
    return;
  }
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
