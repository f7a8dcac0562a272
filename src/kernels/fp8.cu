#include "shardtrain/kernels/gpu/fp8.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <climits>

#include "gpu_pack.cuh"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

// Every float step is an explicit round-to-nearest intrinsic (and this file is built with -fmad=false -ftz=false,
// CMakeLists.txt), so that the codes and scales are the CPU reference's bits.

constexpr int kThreads = 256;

__device__ __forceinline__ int64_t group_of(Fp8Scaling s, int64_t r, int64_t c) {
  return s == Fp8Scaling::kTensor ? 0 : s == Fp8Scaling::kRow ? r : c;
}

// The one definition of an element's cast, for both layouts: st::fp8_encode(v * scale, f).
__device__ __forceinline__ uint8_t encode(float v, float scale, __nv_fp8_interpretation_t format) {
  return __nv_cvt_float_to_fp8(__fmul_rn(v, scale), __NV_SATFINITE, format);
}

// A group's maximum is taken on the bits of |x|: the bits of non-negative floats order as the floats, and a NaN's or
// an infinity's above every finite one, so a non-finite element leaves its group's maximum non-finite (a float max
// would drop a NaN). Each block reduces its elements first and adds one atomicMax per group it touched, so that a
// tensor's single maximum is not one contended address per element. first_bad, when given, gets the lowest index of a
// non-finite element.
struct Amax {
  unsigned bits = 0;
  unsigned long long bad = ULLONG_MAX;
  __device__ void add(float v, int64_t i) {
    bits = max(bits, __float_as_uint(fabsf(v)));
    if (!isfinite(v)) bad = min(bad, static_cast<unsigned long long>(i));
  }
  __device__ void add(const Amax& o) {
    bits = max(bits, o.bits);
    bad = min(bad, o.bad);
  }
};

// The block's threads' Amax combined into thread 0's (every thread of the block calls it).
__device__ Amax block_amax(Amax a) {
  __shared__ unsigned bits[kThreads / 32];
  __shared__ unsigned long long bad[kThreads / 32];
  for (int offset = 16; offset > 0; offset /= 2) {
    Amax o;
    o.bits = __shfl_down_sync(0xffffffffu, a.bits, offset);
    o.bad = __shfl_down_sync(0xffffffffu, a.bad, offset);
    a.add(o);
  }
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) bits[warp] = a.bits, bad[warp] = a.bad;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < static_cast<int>(blockDim.x) / 32; ++w) a.add(Amax{bits[w], bad[w]});
  __syncthreads();  // the shared arrays may be reused by the caller's next call
  return a;
}

__device__ void publish(const Amax& a, unsigned* amax_bits, unsigned long long* first_bad) {
  atomicMax(amax_bits, a.bits);
  if (first_bad != nullptr && a.bad != ULLONG_MAX) atomicMin(first_bad, a.bad);
}

// kTensor: every element into one maximum, a grid-stride loop, one atomic a block.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    amax_tensor_kernel(const T* x, int64_t n, unsigned* amax_bits, unsigned long long* first_bad) {
  Amax a;
  for (int64_t i = thread_index(); i < n; i += thread_count()) a.add(to_f32(x[i]), i);
  a = block_amax(a);
  if (threadIdx.x == 0) publish(a, amax_bits, first_bad);
}

// kRow: a block per row (grid-stride over rows), its threads along the row.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    amax_row_kernel(const T* x, int64_t rows, int64_t cols, unsigned* amax_bits, unsigned long long* first_bad) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    Amax a;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) a.add(to_f32(x[r * cols + c]), r * cols + c);
    a = block_amax(a);
    if (threadIdx.x == 0) publish(a, amax_bits + r, first_bad);
  }
}

// kColumn: a block per 32 columns and kColumnRows rows, its 32 x 8 threads reading rows of 32 consecutive columns;
// each column's 8 partial maxima combined in shared memory, one atomic per column a block.
constexpr int kColumnRows = 256;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    amax_column_kernel(const T* x, int64_t rows, int64_t cols, unsigned* amax_bits, unsigned long long* first_bad) {
  __shared__ unsigned bits[8][32];
  __shared__ unsigned long long bad[8][32];
  const int tx = static_cast<int>(threadIdx.x) % 32, ty = static_cast<int>(threadIdx.x) / 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + tx, r0 = static_cast<int64_t>(blockIdx.y) * kColumnRows;
  Amax a;
  if (c < cols)
    for (int64_t r = r0 + ty; r < rows && r < r0 + kColumnRows; r += 8) a.add(to_f32(x[r * cols + c]), r * cols + c);
  bits[ty][tx] = a.bits;
  bad[ty][tx] = a.bad;
  __syncthreads();
  if (ty == 0 && c < cols) {
    for (int y = 1; y < 8; ++y) a.add(Amax{bits[y][tx], bad[y][tx]});
    publish(a, amax_bits + c, first_bad);
  }
}

// st::fp8_scale's steps per group, and its inverse for the GEMM. A non-finite maximum (only the async cast gets this
// far with one) gives a NaN scale: every code of the group and its inverse scale are then NaN.
__global__ void scale_kernel(const unsigned* amax_bits, int64_t groups, float fp8_max, bool power_of_2, float* scale,
                             float* inverse) {
  for (int64_t g = thread_index(); g < groups; g += thread_count()) {
    const float amax = __uint_as_float(amax_bits[g]);
    float sc = __int_as_float(0x7fffffff);  // NaN
    if (isfinite(amax)) {
      sc = __fdiv_rn(fp8_max, fmaxf(amax, 1e-12f));
      if (power_of_2) sc = __uint_as_float(__float_as_uint(sc) & 0xFF800000u);  // a normal float: its power of two
    }
    scale[g] = sc;
    inverse[g] = __fdiv_rn(1.0f, sc);
  }
}

// A block per row (grid-stride over rows), its threads along the row: each element's group without a division.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(const T* x, int64_t rows, int64_t cols, Fp8Scaling s, const float* scale,
                __nv_fp8_interpretation_t format, uint8_t* q) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
      q[r * cols + c] = encode(to_f32(x[r * cols + c]), scale[group_of(s, r, c)], format);
}

// The transposed cast, q[c * rows + r] = code of x[r, c], through a 32 x 32 tile in shared memory so that both the
// reads of x and the writes of q run along consecutive addresses: a block reads the tile's rows of x (threadIdx.x
// along x's columns), stores each code at [column][row], and writes the tile's rows of q (threadIdx.x along x's
// rows). Tiles run along x's rows in blockIdx.x (the long dimension: tokens) and along its columns in blockIdx.y.
constexpr int kTile = 32, kTileRows = 8;

template <typename T>
__global__ void __launch_bounds__(kTile* kTileRows)
    cast_transposed_kernel(const T* x, int64_t rows, int64_t cols, Fp8Scaling s, const float* scale,
                           __nv_fp8_interpretation_t format, uint8_t* q) {
  // A row of 36 bytes (9 words, odd): the column-wise stores of the first phase fall in 32 different banks.
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c = c0 + threadIdx.x;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t r = r0 + i;
    if (r < rows && c < cols) tile[threadIdx.x][i] = encode(to_f32(x[r * cols + c]), scale[group_of(s, r, c)], format);
  }
  __syncthreads();
  const int64_t r = r0 + threadIdx.x;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t cc = c0 + i;
    if (r < rows && cc < cols) q[cc * rows + r] = tile[i][threadIdx.x];
  }
}

// Scratch as fp8_quantize_scratch_bytes lays it out.
struct CastScratch {
  unsigned long long* first_bad;
  unsigned* amax_bits;
  float* scale;
};

CastScratch cast_scratch(const GpuContext& ctx, int64_t rows, int64_t cols, int64_t groups) {
  ST_CHECK(rows >= 0 && cols >= 0, "gpu::fp8_quantize_matrix: ", rows, " x ", cols);
  ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= fp8_quantize_scratch_bytes(groups),
           "gpu::fp8_quantize_matrix needs ", fp8_quantize_scratch_bytes(groups), " bytes of scratch, ctx has ",
           ctx.scratch_bytes);
  auto* first_bad = static_cast<unsigned long long*>(ctx.scratch);
  auto* amax_bits = reinterpret_cast<unsigned*>(first_bad + 1);
  return {first_bad, amax_bits, reinterpret_cast<float*>(amax_bits + groups)};
}

// The three kernels of a cast, queued on ctx.stream; first_bad null: no record of non-finite elements.
template <typename T>
void enqueue_cast(const T* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling, bool power_of_2,
                  Fp8Layout layout, uint8_t* q, float* inverse_scales, const CastScratch& s,
                  unsigned long long* first_bad, const GpuContext& ctx) {
  const int64_t n = rows * cols, groups = fp8_groups(scaling, rows, cols);
  ST_CUDA_CHECK(cudaMemsetAsync(s.amax_bits, 0, static_cast<size_t>(groups) * sizeof(unsigned), ctx.stream));
  const unsigned grid = grid_for(n, kThreads);
  if (scaling == Fp8Scaling::kTensor) {
    amax_tensor_kernel<T><<<std::min(grid, 2048u), kThreads, 0, ctx.stream>>>(x, n, s.amax_bits, first_bad);
  } else if (scaling == Fp8Scaling::kRow) {
    amax_row_kernel<T><<<static_cast<unsigned>(std::min<int64_t>(rows, 65535)), kThreads, 0, ctx.stream>>>(
        x, rows, cols, s.amax_bits, first_bad);
  } else {
    const int64_t col_blocks = (cols + 31) / 32, row_blocks = (rows + kColumnRows - 1) / kColumnRows;
    ST_CHECK(col_blocks <= INT_MAX && row_blocks <= 65535, "gpu::fp8_quantize_matrix: ", rows, " x ", cols,
             " has too many rows or columns for the column maxima");
    amax_column_kernel<T>
        <<<dim3(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks)), kThreads, 0, ctx.stream>>>(
            x, rows, cols, s.amax_bits, first_bad);
  }
  ST_CUDA_CHECK_LAUNCH();
  scale_kernel<<<grid_for(groups, kThreads), kThreads, 0, ctx.stream>>>(s.amax_bits, groups, fp8_max(f), power_of_2,
                                                                        s.scale, inverse_scales);
  ST_CUDA_CHECK_LAUNCH();
  const __nv_fp8_interpretation_t format = f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  if (layout == Fp8Layout::kRowMajor) {
    cast_kernel<T><<<static_cast<unsigned>(std::min<int64_t>(rows, 65535)), kThreads, 0, ctx.stream>>>(
        x, rows, cols, scaling, s.scale, format, q);
  } else {
    const int64_t row_tiles = (rows + kTile - 1) / kTile, col_tiles = (cols + kTile - 1) / kTile;
    ST_CHECK(row_tiles <= INT_MAX && col_tiles <= 65535, "gpu::fp8_quantize_matrix: ", rows, " x ", cols,
             " is too large to transpose");
    const dim3 tiles(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles));
    cast_transposed_kernel<T>
        <<<tiles, dim3(kTile, kTileRows), 0, ctx.stream>>>(x, rows, cols, scaling, s.scale, format, q);
  }
  ST_CUDA_CHECK_LAUNCH();
}

}  // namespace

template <typename T>
void fp8_quantize_matrix(const T* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling, bool power_of_2,
                         Fp8Layout layout, uint8_t* q, float* inverse_scales, const std::string& what,
                         const GpuContext& ctx) {
  const CastScratch s = cast_scratch(ctx, rows, cols, fp8_groups(scaling, rows, cols));
  if (rows * cols == 0) return;
  ST_CUDA_CHECK(cudaMemsetAsync(s.first_bad, 0xff, sizeof(*s.first_bad), ctx.stream));  // ULLONG_MAX: none yet
  enqueue_cast(x, rows, cols, f, scaling, power_of_2, layout, q, inverse_scales, s, s.first_bad, ctx);
  // One wait: a non-finite activation or gradient surfaces here, named, not as a NaN loss steps later.
  unsigned long long bad = 0;
  ST_CUDA_CHECK(cudaMemcpyAsync(&bad, s.first_bad, sizeof(bad), cudaMemcpyDeviceToHost, ctx.stream));
  ST_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  if (bad == ULLONG_MAX) return;
  ST_BAD_INPUT(what, ": element ", bad, " is ", element_on_host(x, static_cast<int64_t>(bad)),
               "; FP8 casts finite values only");
}

template <typename T>
void fp8_quantize_matrix_async(const T* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling, bool power_of_2,
                               Fp8Layout layout, uint8_t* q, float* inverse_scales, const GpuContext& ctx) {
  const CastScratch s = cast_scratch(ctx, rows, cols, fp8_groups(scaling, rows, cols));
  if (rows * cols == 0) return;
  enqueue_cast(x, rows, cols, f, scaling, power_of_2, layout, q, inverse_scales, s, nullptr, ctx);
}

#define ST_INSTANTIATE_FP8_CAST(T)                                                                                   \
  template void fp8_quantize_matrix<T>(const T*, int64_t, int64_t, Fp8Format, Fp8Scaling, bool, Fp8Layout, uint8_t*, \
                                       float*, const std::string&, const GpuContext&);                               \
  template void fp8_quantize_matrix_async<T>(const T*, int64_t, int64_t, Fp8Format, Fp8Scaling, bool, Fp8Layout,     \
                                             uint8_t*, float*, const GpuContext&);

ST_INSTANTIATE_FP8_CAST(float)
ST_INSTANTIATE_FP8_CAST(bf16)
#undef ST_INSTANTIATE_FP8_CAST

}  // namespace st::gpu
