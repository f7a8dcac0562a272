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

// The one-read kernel: a block of kStagedBlock threads a row, the row staged in shared memory by cp.async, then
// read from there for its max, its sum of exp and its gradient. A 100 KB row (bf16 at GPT-2's vocabulary) leaves
// room for a second block in an H100/H200 SM's 228 KB, so one row's load overlaps the other's reductions and
// stores (a 1024-thread block reading its row into registers runs its load, reductions and store one after
// another, slower even than reading each row twice: docs/performance.md, "Measured and dropped"). A row with no
// room for two takes the fallback. One block per row, scheduled by the hardware: an SM busy with another stream's
// kernel (NCCL's, AdamW's) delays none of the others' rows.
constexpr int kStagedBlock = 512;
constexpr int kStagedBlocksPerSm = 2;

struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// exp for the loss and its gradient. Half-precision logits take the hardware exp2 (max relative error ~2^-21,
// far below their own rounding); fp32 logits keep expf for parity with the CPU reference.
template <typename T>
constexpr bool kHalfLogits = !std::is_same_v<T, float>;
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <typename T>
__device__ __forceinline__ float row_exp(float x) {
  if constexpr (kHalfLogits<T>) {
    return __expf(x);
  } else {
    return expf(x);
  }
}

// exp(x - m), ml = m log2(e): half-precision logits as 2^(x log2(e) - ml), one fused multiply-add before the exp2
// instead of a subtraction and a multiplication.
template <typename T>
__device__ __forceinline__ float exp_minus(float x, float m, float ml) {
  if constexpr (kHalfLogits<T>) {
    return ex2(fmaf(x, kLog2e, -ml));
  } else {
    return row_exp<T>(x - m);
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
  const float ml = m * kLog2e;
  for (int k = 0; k < W; ++k) s += exp_minus<T>(v[k], m, ml);
}

// Calls body(grad) with grad(x) = exp(x - mx) * scale, a row's gradient before its target term (scale = dloss /
// sum). Half-precision logits with scale > 0 fold the scale into the exponent, 2^(x log2(e) - (mx log2(e) -
// log2(scale))): one fused multiply-add and the exp2 an element. The choice is made once a row, outside body's
// loops, so the loops carry no per-element branch.
template <typename T, typename F>
__device__ __forceinline__ void with_row_grad(float mx, float scale, F&& body) {
  if constexpr (kHalfLogits<T>) {
    if (scale > 0.0f) {
      const float shift = mx * kLog2e - log2f(scale);
      body([shift](float x) { return ex2(fmaf(x, kLog2e, -shift)); });
      return;
    }
  }
  body([mx, scale](float x) { return row_exp<T>(x - mx) * scale; });
}

// Subtracts dloss from the element of v (W of them, from column i) that is the target, if any: one comparison a
// pack, not one an element.
template <int W>
__device__ __forceinline__ void subtract_target(float (&v)[W], int64_t i, int tgt, float dloss) {
  if (static_cast<uint64_t>(tgt - i) < static_cast<uint64_t>(W)) {
#pragma unroll
    for (int k = 0; k < W; ++k)
      if (i + k == tgt) v[k] -= dloss;
  }
}

// The fallback, for rows too wide for softmax_cross_entropy_staged_kernel or not packed: one block per row. Each
// thread keeps an online (max, sum of exp) over its elements, by pack, so the row is read once for the loss and
// once more for the gradient.
template <int kVec, typename T>
__global__ void softmax_cross_entropy_kernel(float* losses, T* dlogits, const T* logits, const int32_t* targets,
                                             int64_t N, int V, int Vp, float dloss) {
  __shared__ float shared[kWarpSize];
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const T* x = logits + n * Vp;
    const int tgt = targets[n];
    // Not a target (masked): no loss, no gradient. The branch is the whole block's (one row, one target), so no
    // thread skips a barrier that another waits at.
    if (tgt < 0) {
      if (threadIdx.x == 0) losses[n] = 0.0f;
      if (dlogits != nullptr)
        for (int64_t i = threadIdx.x; i < Vp; i += blockDim.x) dlogits[n * Vp + i] = from_f32<T>(0.0f);
      continue;
    }
    const bool valid = tgt < V;
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
    // In place, each element is read before the same thread writes it.
    with_row_grad<T>(mx, dloss / sum, [&](auto grad) {
      for_each_pack<kVec>(V, threadIdx.x, blockDim.x, [&](int64_t i, auto w) {
        constexpr int W = decltype(w)::value;
        float v[W];
        load<W>(x + i, v);
        for (int k = 0; k < W; ++k) v[k] = grad(v[k]);
        subtract_target(v, i, tgt, dloss);
        store<W>(d + i, v);
      });
    });
    for (int i = V + threadIdx.x; i < Vp; i += blockDim.x) d[i] = from_f32<T>(0.0f);
  }
}

// Dynamic shared memory of softmax_cross_entropy_staged_kernel: the reductions' 32 floats, then the packs that
// hold [0, V).
template <typename T>
size_t staged_smem_bytes(int V) {
  constexpr int kVec = 16 / sizeof(T);
  const size_t packs = (static_cast<size_t>(V) + kVec - 1) / kVec;
  return kWarpSize * sizeof(float) + packs * sizeof(Pack<T, kVec>);
}

// A pack's elements in fp32. bf16 pairs are split with one integer op each (a bf16 is an fp32's high half),
// where element-wise conversion extracts the high one first.
template <int kVec, typename T>
__device__ __forceinline__ void unpack(const Pack<T, kVec>& pk, float (&v)[kVec]) {
  if constexpr (std::is_same_v<T, bf16> && kVec % 2 == 0) {
    const unsigned* w = reinterpret_cast<const unsigned*>(pk.v);
#pragma unroll
    for (int j = 0; j < kVec / 2; ++j) {
      v[2 * j] = __uint_as_float(w[j] << 16);
      v[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = to_f32(pk.v[k]);
  }
}

// The largest element of packs first, first + stride, ... < end. Half types compare raw pairs (__hmax2, exact in
// T, as fmaxf ignoring NaNs): no conversion an element.
template <int kVec, typename T>
__device__ __forceinline__ float packs_max(const Pack<T, kVec>* row, int first, int end, int stride) {
  if constexpr (kHalfLogits<T> && kVec % 2 == 0) {
    using T2 = std::conditional_t<std::is_same_v<T, bf16>, __nv_bfloat162, __half2>;
    T2 acc;
    acc.x = acc.y = from_f32<T>(-INFINITY);
    for (int p = first; p < end; p += stride) {
      const Pack<T, kVec> pk = row[p];
      const T2* h = reinterpret_cast<const T2*>(pk.v);
#pragma unroll
      for (int j = 0; j < kVec / 2; ++j) acc = __hmax2(acc, h[j]);
    }
    return fmaxf(to_f32(acc.x), to_f32(acc.y));
  } else {
    float acc = -INFINITY;
    for (int p = first; p < end; p += stride) {
      const Pack<T, kVec> pk = row[p];
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc = fmaxf(acc, to_f32(pk.v[k]));
    }
    return acc;
  }
}

// The sum of exp(x - mx) over the elements of packs first, first + stride, ... < end (exp_minus).
template <int kVec, typename T>
__device__ __forceinline__ float packs_sum_exp(const Pack<T, kVec>* row, int first, int end, int stride, float mx) {
  float s = 0.0f;
  const float ml = mx * kLog2e;
  for (int p = first; p < end; p += stride) {
    float v[kVec];
    unpack(row[p], v);
#pragma unroll
    for (int k = 0; k < kVec; ++k) s += exp_minus<T>(v[k], mx, ml);
  }
  return s;
}

// The row read once: packed rows (Vp % kVec == 0), as described at kStagedBlock. Each thread stages its own packs
// (p = threadIdx.x, + kStagedBlock, ...) and is the only one to read them back: its part of the max, of the sum
// of exp(x - max) and of the gradient, and it zeros [V, Vp). So no barrier guards the row, and in a grid-stride
// loop a thread's copies of the next row follow its own last read of this one. In place, every read of a row
// precedes the reductions' barriers, hence every write to it. Without dlogits the row is staged all the same and
// nothing is written but the losses: they are those with dlogits, bit for bit.
template <int kVec, typename T>
__global__ void __launch_bounds__(kStagedBlock, kStagedBlocksPerSm)
    softmax_cross_entropy_staged_kernel(float* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N,
                                        int V, int Vp, float dloss) {
  wait_for_predecessor();  // launched by launch_after_predecessor
  using P = Pack<T, kVec>;
  extern __shared__ __align__(16) unsigned char smem[];
  float* shared = reinterpret_cast<float*>(smem);
  const int full = V / kVec;                // packs wholly in [0, V)
  const int packs = (V + kVec - 1) / kVec;  // and the partial one at V, if any
  P* const row = reinterpret_cast<P*>(smem + kWarpSize * sizeof(float));
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    const P* x = reinterpret_cast<const P*>(logits + n * Vp);
    for (int p = threadIdx.x; p < packs; p += kStagedBlock) cp_async_16(row + p, x + p);
    cp_async_commit();
    const int tgt = targets[n];
    // Not a target (masked): no loss, no gradient (block-uniform, as in the fallback). The row's copies were issued
    // before its target was known, so that an unmasked row's load overlaps the target's; each thread waits for its
    // own before it zeroes the packs it copied (in place they are the row itself) or stages the next row there.
    if (tgt < 0) {
      cp_async_wait<0>();
      if (threadIdx.x == 0) losses[n] = 0.0f;
      if (dlogits != nullptr) {
        P zero;
#pragma unroll
        for (int k = 0; k < kVec; ++k) zero.v[k] = from_f32<T>(0.0f);
        P* d = reinterpret_cast<P*>(dlogits + n * Vp);
        for (int p = threadIdx.x; p < Vp / kVec; p += kStagedBlock) d[p] = zero;
      }
      continue;
    }
    const bool valid = tgt < V;
    const float x_tgt = valid ? to_f32(logits[n * Vp + tgt]) : NAN;
    cp_async_wait<0>();
    const int tail = packs > full && threadIdx.x == full % kStagedBlock ? full : -1;  // the partial pack's owner
    // The row's max, then the sum of exp(x - max): two reads of the staged row, and no rescaling of a running sum.
    float m = packs_max<kVec>(row, threadIdx.x, full, kStagedBlock);
    if (tail >= 0)
      for (int k = 0; full * kVec + k < V; ++k) m = fmaxf(m, to_f32(row[tail].v[k]));
    const float mx = block_reduce(m, Max(), shared);
    float s = packs_sum_exp<kVec>(row, threadIdx.x, full, kStagedBlock, mx);
    if (tail >= 0)
      for (int k = 0; full * kVec + k < V; ++k) s += row_exp<T>(to_f32(row[tail].v[k]) - mx);
    const float sum = block_reduce(s, Add(), shared);
    if (threadIdx.x == 0) losses[n] = logf(sum) + mx - x_tgt;
    if (dlogits == nullptr) continue;
    P* d = reinterpret_cast<P*>(dlogits + n * Vp);
    with_row_grad<T>(mx, dloss / sum, [&](auto grad) {
      for (int p = threadIdx.x; p < Vp / kVec; p += kStagedBlock) {
        const int i = p * kVec;
        float v[kVec];
        if (p < full) {
          unpack(row[p], v);
#pragma unroll
          for (int k = 0; k < kVec; ++k) v[k] = grad(v[k]);
        } else {
#pragma unroll
          for (int k = 0; k < kVec; ++k) v[k] = p < packs && i + k < V ? grad(to_f32(row[p].v[k])) : 0.0f;
        }
        if (valid) subtract_target(v, i, tgt, dloss);  // never a padding column
        P pk;
#pragma unroll
        for (int k = 0; k < kVec; ++k) pk.v[k] = from_f32<T>(v[k]);
        d[p] = pk;
      }
    });
  }
}

// The most dynamic shared memory a block of softmax_cross_entropy_staged_kernel<T> may take on the current device
// with kStagedBlocksPerSm of them on an SM (H100/H200: 113 KB). Asked once a device, when the kernel is allowed it.
template <typename T>
size_t staged_capacity() {
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
    const int64_t cap = std::max<int64_t>(0, std::min<int64_t>(per_block, per_sm / kStagedBlocksPerSm - reserved));
    const auto kernel = softmax_cross_entropy_staged_kernel<16 / sizeof(T), T>;
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
  if (vec && staged_smem_bytes<T>(V) <= staged_capacity<T>()) {
    launch_after_predecessor(softmax_cross_entropy_staged_kernel<kVec, T>, grid_for(N, 1), kStagedBlock,
                             staged_smem_bytes<T>(V), ctx.stream, losses, dlogits, logits, targets, N, V, Vp, dloss);
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
