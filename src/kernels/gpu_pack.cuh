// Private to src/kernels/*.cu: fp32 <-> T conversion, packed (vector) loads and stores with a scalar
// fallback, and deterministic warp/block reductions.
//
// A kernel is written once, templated on the pack width kVec; the wrapper picks kVec = 16 / sizeof(T)
// when every pointer allows it and 1 otherwise (launch_packed):
//   for_each_pack<kVec>(n, first, stride, [&](int64_t i, auto w) {
//     constexpr int W = decltype(w)::value;  // kVec, or 1 for the tail
//     float x[W];
//     load<W>(inp + i, x);
//     ...
//     store<W>(out + i, x);
//   });
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/grad_write.h"

namespace st::gpu::kernels_internal {

inline constexpr int kWarpSize = 32;

// Programmatic dependent launch: launch_after_predecessor() lets the device start launching a kernel while the
// stream's previous kernel still runs (sm_90 and up; elsewhere an ordinary launch), which takes the launch latency
// out of the gap between them (bench_launch_gaps; docs/performance.md, "Kernels"). The kernel must call
// wait_for_predecessor() as its first statement: until then the previous kernel may still be writing what it reads,
// or reading what it writes. After it, the previous kernel has finished and its writes are visible.
__device__ __forceinline__ void wait_for_predecessor() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

// Lets the stream's next kernel, when launched by launch_after_predecessor, start launching now instead of at this
// kernel's end: its blocks take the room this kernel's leave and run up to their wait_for_predecessor() (a GEMV reads
// its constant weights there). Harmless where nothing follows that way, and a no-op below sm_90.
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

template <typename... Params, typename... Args>
void launch_after_predecessor(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                              Args... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = cuda_programmatic_launch() ? 1 : 0;
  ST_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

// T is float, bf16 or fp16; arithmetic is always fp32, T only storage.
template <typename T>
__device__ __forceinline__ float to_f32(T x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, bf16>)
    return __bfloat162float(x);
  else {
    static_assert(std::is_same_v<T, fp16>, "T must be float, bf16 or fp16");
    return __half2float(x);
  }
}
// Round to nearest even, as PyTorch's .to(bfloat16) / .to(float16). fp16 overflows to +-inf above 65504.
template <typename T>
__device__ __forceinline__ T from_f32(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, bf16>)
    return __float2bfloat16_rn(x);
  else {
    static_assert(std::is_same_v<T, fp16>, "T must be float, bf16 or fp16");
    return __float2half_rn(x);
  }
}

// kVec elements of T as one aligned load or store (4, 8 or 16 bytes; 16 / sizeof(T) elements when packed:
// 4 floats, 8 bf16 or 8 fp16).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

template <int kVec, typename T>
__device__ __forceinline__ void load(const T* p, float (&x)[kVec]) {
  const Pack<T, kVec> pk = *reinterpret_cast<const Pack<T, kVec>*>(p);
#pragma unroll
  for (int k = 0; k < kVec; ++k) x[k] = to_f32(pk.v[k]);
}

template <int kVec, typename T>
__device__ __forceinline__ void store(T* p, const float (&x)[kVec]) {
  Pack<T, kVec> pk;
#pragma unroll
  for (int k = 0; k < kVec; ++k) pk.v[k] = from_f32<T>(x[k]);
  *reinterpret_cast<Pack<T, kVec>*>(p) = pk;
}

template <int W>
using Width = std::integral_constant<int, W>;

// Visits [0, n) in packs of kVec: thread `first` (counted in packs) takes packs first, first + stride, ...
// and calls f(i, Width<kVec>()) for a full pack at element i, or f(j, Width<1>()) for each element of
// the last, partial pack.
template <int kVec, typename F>
__device__ __forceinline__ void for_each_pack(int64_t n, int64_t first, int64_t stride, F&& f) {
  for (int64_t i = first * kVec; i < n; i += stride * kVec) {
    if (i + kVec <= n) {
      f(i, Width<kVec>());
    } else {
      for (int64_t j = i; j < n; ++j) f(j, Width<1>());
    }
  }
}

// A grid-stride loop's start and stride.
__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_count() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// True when every pointer is aligned for packs of `bytes` (null pointers are ignored).
template <typename... Ptrs>
bool all_aligned(size_t bytes, const Ptrs*... ptrs) {
  return ((reinterpret_cast<uintptr_t>(ptrs) % bytes == 0) && ...);
}

// Runs launch(Width<16 / sizeof(E)>()) when `vec`, else launch(Width<1>()): the lambda launches the kernel
// instantiated for that pack width. Then checks the launch.
template <typename E, typename F>
void launch_packed(bool vec, F&& launch) {
  if (vec)
    launch(Width<16 / sizeof(E)>());
  else
    launch(Width<1>());
  ST_CUDA_CHECK_LAUNCH();
}

// Element i of device array x, copied to the host as a float (synchronous): the value an error message names.
template <typename T>
float element_on_host(const T* x, int64_t i) {
  T value;
  ST_CUDA_CHECK(cudaMemcpy(&value, x + i, sizeof(T), cudaMemcpyDeviceToHost));
  if constexpr (std::is_same_v<T, float>)
    return value;
  else if constexpr (std::is_same_v<T, bf16>)
    return __bfloat162float(value);
  else
    return __half2float(value);
}

// Threads for n items with `block` threads each, for a grid-stride loop: capped so huge n reuses threads.
inline unsigned grid_for(int64_t n, int block) {
  constexpr int64_t kMaxBlocks = 1 << 16;
  const int64_t blocks = (n + block - 1) / block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

// The most dynamic shared memory the current device lets one block opt in to (227 KB on H100/H200, 99 KB on an
// RTX 4090). Asked of the driver once for every device: launch paths call this at each launch.
inline size_t smem_per_block_optin() {
  static const std::vector<int> limits = [] {
    int devices = 0;
    ST_CUDA_CHECK(cudaGetDeviceCount(&devices));
    std::vector<int> v(static_cast<size_t>(devices));
    for (int d = 0; d < devices; ++d)
      ST_CUDA_CHECK(cudaDeviceGetAttribute(&v[static_cast<size_t>(d)], cudaDevAttrMaxSharedMemoryPerBlockOptin, d));
    return v;
  }();
  int device = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  return static_cast<size_t>(limits.at(static_cast<size_t>(device)));
}

// Shared-memory address of a generic pointer into shared memory, for PTX.
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared without going through registers (sm_80 on), cached in L2 only; with valid == false
// nothing is read and the destination is zero-filled. Volatile, with a memory clobber, so that the copies are
// neither hoisted out of loops nor merged across barriers.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid = true) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight; the copies of the others are then
// visible to this thread (to the block only after a barrier).
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Butterfly reduction: every lane ends with the result, combined in the same order on every run.
template <typename V, typename Op>
__device__ __forceinline__ V warp_reduce(V v, Op op) {
#pragma unroll
  for (int off = kWarpSize / 2; off > 0; off /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

// Block-wide reduction for blockDim.x a multiple of 32 (at most 1024); every thread gets the result.
// `shared` holds at least 32 V. Deterministic: the combination order depends only on blockDim.x.
template <typename V, typename Op>
__device__ V block_reduce(V v, Op op, V* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int nwarps = blockDim.x / kWarpSize;
  v = warp_reduce(v, op);
  __syncthreads();  // `shared` may still be read from a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = shared[0];
  for (int w = 1; w < nwarps; ++w) v = op(v, shared[w]);
  return v;
}

// SiLU as the CPU reference computes it: silu(g) = g / (1 + exp(-g)); for g << 0, expf overflows to inf and silu is
// -0. The SwiGLU kernels and the GEMV that stages a SwiGLU share it, so that they give the same bits.
__device__ __forceinline__ float silu(float g) { return g / (1.0f + expf(-g)); }

struct Add {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return a + b;
  }
};
// The optional `unsigned* amax` of the kernels that write a linear layer's input (RMSNorm, SwiGLU, RoPE's backward,
// ...): the tensorwise maximum that fp8_maxima_async (kernels/gpu/fp8.h) would take of what they write, folded in as
// they write it. Each value counts as stored (rounded to T), by fp8.cu's own expression, the bits of |v| as a float:
// the bits of non-negative floats order as the floats, and an infinity's or a NaN's lie above every finite one, so
// the fold gives that pass's bits whatever the order. A kernel stores through store() (or folds a value it only reads
// through add()), and every thread of the block then calls finish(): one atomicMax a block into *out, which the
// caller zeroed. With out null nothing is folded and finish() returns at once.
struct MaximumFold {
  unsigned* out = nullptr;
  unsigned bits = 0;

  struct Larger {
    __device__ __forceinline__ unsigned operator()(unsigned a, unsigned b) const { return max(a, b); }
  };

  template <typename T>
  __device__ __forceinline__ void add(T stored) {
    if (out != nullptr) bits = max(bits, __float_as_uint(fabsf(to_f32(stored))));
  }
  // store<kVec>(p, x), folding the stored values.
  template <int kVec, typename T>
  __device__ __forceinline__ void store(T* p, const float (&x)[kVec]) {
    Pack<T, kVec> pk;
#pragma unroll
    for (int k = 0; k < kVec; ++k) pk.v[k] = from_f32<T>(x[k]);
    *reinterpret_cast<Pack<T, kVec>*>(p) = pk;
#pragma unroll
    for (int k = 0; k < kVec; ++k) add(pk.v[k]);
  }
  // Every thread of the block (blockDim.x a multiple of 32, blockDim.y = blockDim.z = 1), after its last fold.
  __device__ void finish() {
    if (out == nullptr) return;  // uniform over the grid
    __shared__ unsigned shared[kWarpSize];
    const unsigned m = block_reduce(bits, Larger(), shared);
    if (threadIdx.x == 0) atomicMax(out, m);
  }
};

// The second level of a deterministic column sum: out[c] += sum over g in [0, chunks) of part[g * C + c], for
// c in [0, C), where part holds per-chunk partial sums (fp32). A block covers 32 columns with
// kFinishLanes lanes down the chunks: lane y adds chunks y, y + kFinishLanes, ... in order, then lane 0 adds
// the lanes' sums in order. The tree depends only on `chunks`, so the result is the same on every run; and
// each thread's loads are independent (issued kFinishBatch at a time), so hundreds of chunks cost a few memory
// latencies, not hundreds. blockIdx.y picks one of two (out, part) pairs, so two column sums of the same
// shape can finish in one launch.
constexpr int kFinishLanes = 32;
constexpr int kFinishBatch = 24;  // one round for up to 768 chunks (LayerNorm makes about that many)

// One block of that finish: columns [32 col_block, 32 col_block + 32) of one (out, part). Also the body of
// ColumnSums's batched finish (column_sums.cu), so both give the same bits.
template <typename T>
__device__ __forceinline__ void finish_column_sums_block(T* out, const float* part, int64_t chunks, int C,
                                                         bool accumulate, int col_block) {
  __shared__ float lanes[kFinishLanes][kWarpSize + 1];
  const int c = col_block * kWarpSize + threadIdx.x;
  float acc = 0.0f;
  if (c < C) {
    // kFinishBatch loads in flight at a time, whatever `chunks` is (an unrolled loop with a remainder would run
    // the remainder's loads one after another); the additions stay in chunk order.
    for (int64_t g0 = threadIdx.y; g0 < chunks; g0 += kFinishLanes * kFinishBatch) {
      float v[kFinishBatch];
#pragma unroll
      for (int u = 0; u < kFinishBatch; ++u) {
        const int64_t g = g0 + u * kFinishLanes;
        v[u] = g < chunks ? part[g * C + c] : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kFinishBatch; ++u)
        if (g0 + u * kFinishLanes < chunks) acc += v[u];
    }
  }
  lanes[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  float sum = 0.0f;
  for (int y = 0; y < kFinishLanes; ++y) sum += lanes[y][threadIdx.x];
  out[c] = from_f32<T>((accumulate ? to_f32(out[c]) : 0.0f) + sum);  // overwriting: what a zeroed out would get
}

template <typename T>
__global__ void __launch_bounds__(kWarpSize* kFinishLanes)
    finish_column_sums_kernel(T* out0, const float* part0, T* out1, const float* part1, int64_t chunks, int C,
                              bool accumulate) {
  finish_column_sums_block(blockIdx.y == 0 ? out0 : out1, blockIdx.y == 0 ? part0 : part1, chunks, C, accumulate,
                           static_cast<int>(blockIdx.x));
}

// Launches the first `outputs` (1 or 2) of the finishes (out0, part0), (out1, part1).
template <typename T>
void launch_finish_column_sums(unsigned outputs, T* out0, const float* part0, T* out1, const float* part1,
                               int64_t chunks, int C, cudaStream_t stream, GradWrite write) {
  const dim3 grid((C + kWarpSize - 1) / kWarpSize, outputs);
  finish_column_sums_kernel<<<grid, dim3(kWarpSize, kFinishLanes), 0, stream>>>(out0, part0, out1, part1, chunks, C,
                                                                                write == GradWrite::kAccumulate);
  ST_CUDA_CHECK_LAUNCH();
}

template <typename T>
void finish_column_sums(T* out, const float* part, int64_t chunks, int C, cudaStream_t stream,
                        GradWrite write = GradWrite::kAccumulate) {
  launch_finish_column_sums(1, out, part, out, part, chunks, C, stream, write);
}

// Two column sums over the same chunks and C in one launch: out0 from part0 and out1 from part1, each exactly as
// finish_column_sums would (LayerNorm's dweight and dbias).
template <typename T>
void finish_column_sums_pair(T* out0, const float* part0, T* out1, const float* part1, int64_t chunks, int C,
                             cudaStream_t stream, GradWrite write = GradWrite::kAccumulate) {
  launch_finish_column_sums(2, out0, part0, out1, part1, chunks, C, stream, write);
}

}  // namespace st::gpu::kernels_internal
