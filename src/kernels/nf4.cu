#include "shardtrain/kernels/gpu/nf4.h"

#include <algorithm>
#include <climits>

#include "gpu_pack.cuh"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

// Every float step below is an explicit round-to-nearest intrinsic, so that nvcc can neither fuse a multiply and an
// add (the CPU reference is built without contraction) nor swap IEEE division for its approximation: the bytes must
// be the CPU's. This file is also built with -fmad=false -ftz=false (CMakeLists.txt): subnormal weights and absmaxes
// are quantised as the CPU quantises them, not flushed to zero.

constexpr int kGroupThreads = 256;  // the quantiser's thread blocks, one per group; kernel 3 has a thread per absmax
static_assert(kGroupThreads == kNf4AbsmaxGroupSize, "one thread per absmax of a group");
constexpr int kBlocksPerWarpPass = kGroupThreads / kWarpSize;  // kernel 1: a warp quantises one block at a time
static_assert(kNf4BlockSize == 2 * kWarpSize, "kernel 1: two weights (one code byte) per lane");
constexpr int kChunk = 8;  // the dequantiser's weights per thread: four code bytes
constexpr int kDequantThreads = 256;

// The levels travel as a kernel argument and are copied to shared memory (a lookup with a per-thread index).
struct LevelTable {
  float v[16];
};
LevelTable level_table() {
  LevelTable l;
  std::copy(kNf4Levels.begin(), kNf4Levels.end(), l.v);
  return l;
}
__device__ __forceinline__ void load_levels(const LevelTable& from, float* to) {
  if (threadIdx.x < 16) to[threadIdx.x] = from.v[threadIdx.x];
  __syncthreads();
}

struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// st::nf4_absmax's steps.
__device__ __forceinline__ float dequantised_absmax(int8_t q, float scale, float offset) {
  return __fadd_rn(__fmul_rn(__fdiv_rn(static_cast<float>(q), 127.0f), scale), offset);
}

__device__ __forceinline__ int code_of(float x, float absmax, const float* levels) {
  return absmax == 0.0f ? 7 : nf4_nearest_code(__fdiv_rn(x, absmax), levels);
}

// Kernel 1, a thread block per group of 256 NF4 blocks: each NF4 block's absmax (scratch and shared) and codes, the
// lowest index of a non-finite weight (atomicMin), and the group's absmaxes summed in order in double, by one thread.
// Max is exact and commutative, so the warp's butterfly gives the CPU's absmax; the sum is not, so it stays sequential.
// A missing weight past n counts as 0, which raises no max of magnitudes.
template <typename T>
__global__ void __launch_bounds__(kGroupThreads)
    absmax_codes_kernel(const T* x, int64_t n, uint8_t* codes, float* absmax, double* group_sums,
                        unsigned long long* first_bad, LevelTable levels_arg) {
  __shared__ float levels[16];
  __shared__ float group_absmax[kNf4AbsmaxGroupSize];
  load_levels(levels_arg, levels);
  const int64_t first_block = static_cast<int64_t>(blockIdx.x) * kNf4AbsmaxGroupSize;
  const int blocks = static_cast<int>(min(nf4_blocks(n) - first_block, int64_t{kNf4AbsmaxGroupSize}));
  const int lane = threadIdx.x % kWarpSize;
  for (int k = static_cast<int>(threadIdx.x) / kWarpSize; k < blocks; k += kBlocksPerWarpPass) {
    const int64_t i = (first_block + k) * kNf4BlockSize + 2 * lane;
    const bool has0 = i < n, has1 = i + 1 < n;
    const float x0 = has0 ? to_f32(x[i]) : 0.0f, x1 = has1 ? to_f32(x[i + 1]) : 0.0f;
    if (!isfinite(x0)) atomicMin(first_bad, static_cast<unsigned long long>(i));
    if (!isfinite(x1)) atomicMin(first_bad, static_cast<unsigned long long>(i + 1));
    const float m = warp_reduce(fmaxf(fabsf(x0), fabsf(x1)), Max());
    if (has0) codes[i / 2] = static_cast<uint8_t>((code_of(x0, m, levels) << 4) | (has1 ? code_of(x1, m, levels) : 0));
    if (lane == 0) absmax[first_block + k] = group_absmax[k] = m;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int k = 0; k < blocks; ++k) sum = __dadd_rn(sum, static_cast<double>(group_absmax[k]));
    group_sums[blockIdx.x] = sum;
  }
}

// Kernel 2, one thread: the offset, from the group sums added in order.
__global__ void offset_kernel(const double* group_sums, int64_t groups, int64_t blocks, float* offset) {
  double sum = 0.0;
  for (int64_t g = 0; g < groups; ++g) sum = __dadd_rn(sum, group_sums[g]);
  *offset = __double2float_rn(__ddiv_rn(sum, static_cast<double>(blocks)));
}

// Kernel 3, a thread block per group and a thread per absmax: the group's scale and its absmaxes' 8-bit codes.
__global__ void __launch_bounds__(kGroupThreads)
    absmax_quantize_kernel(const float* absmax, int64_t blocks, int8_t* absmax_codes, float* absmax_scales,
                           const float* offset) {
  __shared__ float shared[kWarpSize];
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kNf4AbsmaxGroupSize + threadIdx.x;
  const float centred = b < blocks ? __fsub_rn(absmax[b], *offset) : 0.0f;
  const float scale = block_reduce(fabsf(centred), Max(), shared);
  if (threadIdx.x == 0) absmax_scales[blockIdx.x] = scale;
  if (b >= blocks) return;
  const float r = scale == 0.0f ? 0.0f : rintf(__fmul_rn(__fdiv_rn(centred, scale), 127.0f));  // half to even
  absmax_codes[b] = static_cast<int8_t>(fminf(fmaxf(r, -127.0f), 127.0f));
}

// A thread per chunk of kChunk weights (which never straddles a block: kNf4BlockSize is a multiple of kChunk), in a
// grid-stride loop. kPacked: a full chunk's codes in one 4-byte load (byte k holds weights 2k and 2k + 1) and its
// values in 16-byte stores; the last, partial chunk and the unaligned case go one weight at a time.
template <typename T, bool kPacked>
__global__ void __launch_bounds__(kDequantThreads) dequantize_kernel(Nf4ConstView q, T* out, LevelTable levels_arg) {
  __shared__ float levels[16];
  load_levels(levels_arg, levels);
  const float offset = *q.absmax_offset;
  const int64_t chunks = (q.n + kChunk - 1) / kChunk;
  for (int64_t c = thread_index(); c < chunks; c += thread_count()) {
    const int64_t block = c * kChunk / kNf4BlockSize, first = c * kChunk;
    const float absmax =
        dequantised_absmax(q.absmax_codes[block], q.absmax_scales[block / kNf4AbsmaxGroupSize], offset);
    if (kPacked && first + kChunk <= q.n) {
      constexpr int kPack = 16 / sizeof(T);
      const uint32_t bytes = reinterpret_cast<const uint32_t*>(q.codes)[c];
      float v[kChunk / kPack][kPack];
#pragma unroll
      for (int k = 0; k < kChunk; ++k) {
        const uint32_t byte = (bytes >> (8 * (k / 2))) & 0xffu;  // little-endian: the lower byte comes first
        v[k / kPack][k % kPack] = __fmul_rn(levels[k % 2 == 0 ? byte >> 4 : byte & 15u], absmax);
      }
#pragma unroll
      for (int s = 0; s < kChunk / kPack; ++s) store<kPack>(out + first + s * kPack, v[s]);
    } else {
      for (int64_t i = first; i < min(q.n, first + kChunk); ++i)
        out[i] = from_f32<T>(__fmul_rn(levels[q.code(i)], absmax));
    }
  }
}

}  // namespace

template <typename T>
void nf4_quantize(const T* x, int64_t n, Nf4View out, const std::string& name, const GpuContext& ctx) {
  ST_CHECK(n >= 0 && out.n == n, "gpu::nf4_quantize: ", n, " weights into storage for ", out.n);
  const int64_t blocks = nf4_blocks(n), groups = nf4_groups(n);
  if (n == 0) {
    ST_CUDA_CHECK(cudaMemsetAsync(out.absmax_offset, 0, sizeof(float), ctx.stream));
    return;
  }
  ST_CHECK(groups <= INT_MAX, "gpu::nf4_quantize: ", groups, " groups of absmaxes exceed a grid");
  ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= nf4_quantize_scratch_bytes(n), "gpu::nf4_quantize needs ",
           nf4_quantize_scratch_bytes(n), " bytes of scratch, ctx has ", ctx.scratch_bytes);
  // Scratch as nf4_quantize_scratch_bytes lays it out.
  auto* first_bad = static_cast<unsigned long long*>(ctx.scratch);
  auto* group_sums = reinterpret_cast<double*>(first_bad + 1);
  auto* absmax = reinterpret_cast<float*>(group_sums + groups);
  ST_CUDA_CHECK(cudaMemsetAsync(first_bad, 0xff, sizeof(*first_bad), ctx.stream));  // ULLONG_MAX: none yet

  const auto grid = static_cast<unsigned>(groups);
  absmax_codes_kernel<T>
      <<<grid, kGroupThreads, 0, ctx.stream>>>(x, n, out.codes, absmax, group_sums, first_bad, level_table());
  ST_CUDA_CHECK_LAUNCH();
  offset_kernel<<<1, 1, 0, ctx.stream>>>(group_sums, groups, blocks, out.absmax_offset);
  ST_CUDA_CHECK_LAUNCH();
  absmax_quantize_kernel<<<grid, kGroupThreads, 0, ctx.stream>>>(absmax, blocks, out.absmax_codes, out.absmax_scales,
                                                                 out.absmax_offset);
  ST_CUDA_CHECK_LAUNCH();

  // Quantisation happens at load time, where one wait is cheap beside reading the weights; without it a NaN in a
  // checkpoint would surface later as a NaN loss far from its cause.
  unsigned long long bad = 0;
  ST_CUDA_CHECK(cudaMemcpyAsync(&bad, first_bad, sizeof(bad), cudaMemcpyDeviceToHost, ctx.stream));
  ST_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  if (bad == ULLONG_MAX) return;
  nf4_refuse(name, static_cast<int64_t>(bad), element_on_host(x, static_cast<int64_t>(bad)));
}

template <typename T>
void nf4_dequantize(Nf4ConstView q, T* out, const GpuContext& ctx) {
  if (q.n == 0) return;
  const unsigned grid = grid_for((q.n + kChunk - 1) / kChunk, kDequantThreads);
  if (all_aligned(4, q.codes) && all_aligned(16, out))
    dequantize_kernel<T, true><<<grid, kDequantThreads, 0, ctx.stream>>>(q, out, level_table());
  else
    dequantize_kernel<T, false><<<grid, kDequantThreads, 0, ctx.stream>>>(q, out, level_table());
  ST_CUDA_CHECK_LAUNCH();
}

template void nf4_quantize<float>(const float*, int64_t, Nf4View, const std::string&, const GpuContext&);
template void nf4_quantize<bf16>(const bf16*, int64_t, Nf4View, const std::string&, const GpuContext&);
template void nf4_dequantize<float>(Nf4ConstView, float*, const GpuContext&);
template void nf4_dequantize<bf16>(Nf4ConstView, bf16*, const GpuContext&);
template void nf4_dequantize<fp16>(Nf4ConstView, fp16*, const GpuContext&);

}  // namespace st::gpu
