#include "shardtrain/kernels/gpu/fp8.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <climits>

#include "fp8_ahead.cuh"
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

struct MaxOp {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return max(a, b);
  }
};
struct MinOp {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return min(a, b);
  }
};

// The block's threads' Amax combined (gpu_pack.cuh's block_reduce on each field; every thread gets it).
__device__ Amax block_amax(Amax a) {
  __shared__ unsigned bits[32];
  __shared__ unsigned long long bad[32];
  return Amax{block_reduce(a.bits, MaxOp{}, bits), block_reduce(a.bad, MinOp{}, bad)};
}

__device__ void publish(const Amax& a, unsigned* amax_bits, unsigned long long* first_bad) {
  atomicMax(amax_bits, a.bits);
  if (first_bad != nullptr && a.bad != ULLONG_MAX) atomicMin(first_bad, a.bad);
}

// st::fp8_scale's steps for a group whose maximum has the bits amax_bits. A non-finite maximum (only the async cast
// gets this far with one) gives a NaN scale: every code of the group and its inverse scale are then NaN.
__device__ __forceinline__ float scale_of(unsigned amax_bits, float fp8_max, bool power_of_2) {
  const float amax = __uint_as_float(amax_bits);
  if (!isfinite(amax)) return __int_as_float(0x7fffffff);
  float sc = __fdiv_rn(fp8_max, fmaxf(amax, 1e-12f));
  if (power_of_2) sc = __uint_as_float(__float_as_uint(sc) & 0xFF800000u);  // a normal float: its power of two
  return sc;
}

// Each group's scale, and its inverse for the GEMM; `ahead`: fp8_quantize_ahead's scale of a maximum known ahead.
__global__ void scale_kernel(const unsigned* amax_bits, int64_t groups, float fp8_max, bool power_of_2, bool ahead,
                             float* scale, float* inverse) {
  for (int64_t g = thread_index(); g < groups; g += thread_count()) {
    const float sc = ahead ? scale_ahead(amax_bits[g], fp8_max) : scale_of(amax_bits[g], fp8_max, power_of_2);
    scale[g] = sc;
    inverse[g] = __fdiv_rn(1.0f, sc);
  }
}

// Every kernel below reads V consecutive elements of a row at a time: V = 8 (one 16-byte load of bf16, two of float,
// and one 8-byte store of codes) where the rows allow it (packed_ok), V = 1 otherwise.
constexpr int kVec = 8;

// kTensor: every element into one maximum, a grid-stride loop, one atomic a block.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    amax_tensor_kernel(const T* x, int64_t n, unsigned* amax_bits, unsigned long long* first_bad) {
  Amax a;
  for (int64_t i = thread_index() * V; i < n; i += thread_count() * V) {
    float v[V];
    load<V>(x + i, v);
#pragma unroll
    for (int k = 0; k < V; ++k) a.add(v[k], i + k);
  }
  a = block_amax(a);
  if (threadIdx.x == 0) publish(a, amax_bits, first_bad);
}

// kRow's maximum of row r (every thread of the block calls it; thread 0 gets it).
template <typename T, int V>
__device__ Amax row_amax(const T* x, int64_t r, int64_t cols) {
  Amax a;
  for (int64_t c = threadIdx.x * V; c < cols; c += static_cast<int64_t>(blockDim.x) * V) {
    float v[V];
    load<V>(x + r * cols + c, v);
#pragma unroll
    for (int k = 0; k < V; ++k) a.add(v[k], r * cols + c + k);
  }
  return block_amax(a);
}

// kRow: a block per row (grid-stride over rows), its threads along the row.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    amax_row_kernel(const T* x, int64_t rows, int64_t cols, unsigned* amax_bits, unsigned long long* first_bad) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const Amax a = row_amax<T, V>(x, r, cols);
    if (threadIdx.x == 0) publish(a, amax_bits + r, first_bad);
  }
}

// kColumn: a block per 32 V columns and kColumnRows rows, its 32 x 8 threads each reading V consecutive columns of
// every 8th row; each column's 8 partial maxima combined in shared memory, one atomic per column a block.
constexpr int kColumnRows = 256;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    amax_column_kernel(const T* x, int64_t rows, int64_t cols, unsigned* amax_bits, unsigned long long* first_bad) {
  __shared__ unsigned bits[8][32 * V];
  __shared__ unsigned long long bad[8][32 * V];
  const int tx = static_cast<int>(threadIdx.x) % 32, ty = static_cast<int>(threadIdx.x) / 32;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * 32 * V, c = c0 + tx * V;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kColumnRows;
  Amax a[V];
  if (c < cols)
    for (int64_t r = r0 + ty; r < rows && r < r0 + kColumnRows; r += 8) {
      float v[V];
      load<V>(x + r * cols + c, v);
#pragma unroll
      for (int k = 0; k < V; ++k) a[k].add(v[k], r * cols + c + k);
    }
#pragma unroll
  for (int k = 0; k < V; ++k) {
    bits[ty][tx * V + k] = a[k].bits;
    bad[ty][tx * V + k] = a[k].bad;
  }
  __syncthreads();
  for (int j = static_cast<int>(threadIdx.x); j < 32 * V; j += kThreads) {
    if (c0 + j >= cols) continue;
    Amax m{bits[0][j], bad[0][j]};
    for (int y = 1; y < 8; ++y) m.add(Amax{bits[y][j], bad[y][j]});
    publish(m, amax_bits + c0 + j, first_bad);
  }
}

// Where a kernel writes a cast's codes, with their groups, scales and format.
struct Codes {
  Fp8Scaling s;
  const float* scale;
  __nv_fp8_interpretation_t format;
  uint8_t* q;
  bool nan_codes = false;  // fp8_quantize_ahead: a non-finite element's code is NaN's (0x7f), never saturated
};

// An element's code as `o` casts it.
__device__ __forceinline__ uint8_t encode(float v, float scale, const Codes& o) {
  return o.nan_codes ? code_ahead(v, scale, o.format) : encode(v, scale, o.format);
}

// The scale of element (r, c).
__device__ __forceinline__ float scale_at(const Codes& o, int64_t r, int64_t c) { return o.scale[group_of(o.s, r, c)]; }

// The codes of V elements v of row r from column c on, each with its own scale only where the groups are columns.
template <int V>
__device__ __forceinline__ Pack<uint8_t, V> encode_pack(const float (&v)[V], int64_t r, int64_t c, const Codes& o) {
  Pack<uint8_t, V> out;
  if (o.s == Fp8Scaling::kColumn) {
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = encode(v[k], o.scale[c + k], o);
  } else {
    const float sc = o.scale[o.s == Fp8Scaling::kRow ? r : 0];
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = encode(v[k], sc, o);
  }
  return out;
}

// The elements a kernel read, folded into `fold` (none where its out is null).
template <int V>
__device__ __forceinline__ void fold_all(MaximumFold& fold, const float (&v)[V]) {
#pragma unroll
  for (int k = 0; k < V; ++k) fold.add(v[k]);
}

// V codes of row r from column c on, stored in x's layout (at o.q + r * cols + c, 8-byte aligned when V = 8); the
// elements folded into `fold` when given.
template <typename T, int V>
__device__ __forceinline__ void cast_pack(const T* x, int64_t r, int64_t cols, int64_t c, const Codes& o,
                                          MaximumFold* fold = nullptr) {
  float v[V];
  load<V>(x + r * cols + c, v);
  *reinterpret_cast<Pack<uint8_t, V>*>(o.q + r * cols + c) = encode_pack<V>(v, r, c, o);
  if (fold != nullptr) fold_all<V>(*fold, v);
}

// A grid-stride loop over the matrix's packs of V elements (rows of whole packs: cols % V == 0), every thread busy
// whatever the row width; a pack's row is one division, none for kTensor. own, when not null: x's maximum folded in.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
    cast_kernel(const T* x, int64_t rows, int64_t cols, Codes o, unsigned* own) {
  const int64_t n = rows * cols;
  MaximumFold fold{own};
  for (int64_t i = thread_index() * V; i < n; i += thread_count() * V) {
    const int64_t r = o.s == Fp8Scaling::kTensor ? 0 : i / cols;
    cast_pack<T, V>(x, r, cols, i - r * cols, o, &fold);
  }
  fold.finish();
}

// kRow in x's layout, in one kernel: a block per row takes the row's maximum, its scale (scale_of) and casts the
// row, which it reads twice (the second time from cache). kRowThreads a block: a model's rows (3,072 to 28,672 bf16)
// are then 3 to 28 packs a thread, with little of the last round idle.
constexpr int kRowThreads = 128;

template <typename T, int V>
__global__ void __launch_bounds__(kRowThreads)
    row_cast_kernel(const T* x, int64_t rows, int64_t cols, float fp8_max, bool power_of_2,
                    __nv_fp8_interpretation_t format, float* inverse, uint8_t* q, unsigned long long* first_bad) {
  __shared__ float row_scale;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const Amax a = row_amax<T, V>(x, r, cols);
    if (threadIdx.x == 0) {
      if (first_bad != nullptr && a.bad != ULLONG_MAX) atomicMin(first_bad, a.bad);
      row_scale = scale_of(a.bits, fp8_max, power_of_2);
      inverse[r] = __fdiv_rn(1.0f, row_scale);
    }
    __syncthreads();
    for (int64_t c = threadIdx.x * V; c < cols; c += static_cast<int64_t>(blockDim.x) * V)
      cast_pack<T, V>(x, r, cols, c, Codes{Fp8Scaling::kTensor, &row_scale, format, q});
    __syncthreads();  // row_scale is the next row's
  }
}

// The transposed cast, t.q[c * rows + r] = code of x[r, c], through a tile in shared memory so that both the reads of
// x and the writes of the codes run along consecutive addresses: a block reads the tile's rows of x, stores each code
// at [column][row], and writes the tile's rows of the codes. Tiles run along x's rows in blockIdx.x (the long
// dimension: tokens) and along its columns in blockIdx.y. Scalar: 32 x 32 tiles, a thread an element. Packed (rows
// and columns multiples of 8): 64 x 64 tiles, a thread reading 8 elements of a row of x and writing 8 codes of a row
// of t; with a second cast `row` (row.q not null) it also writes those 8 elements' codes in x's layout, so that one
// read of x gives both casts (fp8_quantize_pair); with own not null, x's maximum folded in as it is read.
constexpr int kTile = 32, kTileRows = 8, kWideTile = 64;

template <typename T>
__global__ void __launch_bounds__(kTile* kTileRows)
    cast_transposed_kernel(const T* x, int64_t rows, int64_t cols, Codes t) {
  // A row of 36 bytes (9 words, odd): the column-wise stores of the first phase fall in 32 different banks.
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c = c0 + threadIdx.x;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t r = r0 + i;
    if (r < rows && c < cols) tile[threadIdx.x][i] = encode(to_f32(x[r * cols + c]), scale_at(t, r, c), t);
  }
  __syncthreads();
  const int64_t r = r0 + threadIdx.x;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t cc = c0 + i;
    if (r < rows && cc < cols) t.q[cc * rows + r] = tile[i][threadIdx.x];
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    cast_transposed_packed_kernel(const T* x, int64_t rows, int64_t cols, Codes t, Codes row, unsigned* own) {
  __shared__ uint8_t tile[kWideTile][kWideTile + 8];  // [column of x][row of x]
  MaximumFold fold{own};
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kWideTile, c0 = static_cast<int64_t>(blockIdx.y) * kWideTile;
  const int lane8 = static_cast<int>(threadIdx.x) % 8, line = static_cast<int>(threadIdx.x) / 8;  // 8 x 32 threads
  for (int i = line; i < kWideTile; i += kThreads / 8) {
    const int64_t r = r0 + i, c = c0 + lane8 * kVec;
    if (r >= rows || c >= cols) continue;
    float v[kVec];
    load<kVec>(x + r * cols + c, v);
    fold_all<kVec>(fold, v);
    const Pack<uint8_t, kVec> codes = encode_pack<kVec>(v, r, c, t);
#pragma unroll
    for (int k = 0; k < kVec; ++k) tile[lane8 * kVec + k][i] = codes.v[k];
    if (row.q != nullptr)
      *reinterpret_cast<Pack<uint8_t, kVec>*>(row.q + r * cols + c) = encode_pack<kVec>(v, r, c, row);
  }
  __syncthreads();
  for (int j = line; j < kWideTile; j += kThreads / 8) {
    const int64_t cc = c0 + j, r = r0 + lane8 * kVec;
    if (cc >= cols || r >= rows) continue;
    Pack<uint8_t, kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) out.v[k] = tile[j][lane8 * kVec + k];
    *reinterpret_cast<Pack<uint8_t, kVec>*>(t.q + cc * rows + r) = out;
  }
  fold.finish();
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

// Whether the packed kernels (V = 8) can read x and write q: rows of whole packs, and aligned pointers.
template <typename T>
bool packed_ok(const T* x, int64_t cols, const uint8_t* q) {
  return cols % kVec == 0 && reinterpret_cast<uintptr_t>(x) % (kVec * sizeof(T)) == 0 &&
         reinterpret_cast<uintptr_t>(q) % kVec == 0;
}

__nv_fp8_interpretation_t interpretation(Fp8Format f) { return f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2; }

// The groups' maxima of x into amax_bits (zeroed first), on ctx.stream.
template <typename T>
void enqueue_maxima(const T* x, int64_t rows, int64_t cols, Fp8Scaling scaling, bool packed, unsigned* amax_bits,
                    unsigned long long* first_bad, const GpuContext& ctx) {
  const int64_t n = rows * cols, groups = fp8_groups(scaling, rows, cols);
  ST_CUDA_CHECK(cudaMemsetAsync(amax_bits, 0, static_cast<size_t>(groups) * sizeof(unsigned), ctx.stream));
  if (scaling == Fp8Scaling::kTensor) {
    const unsigned grid = std::min(grid_for(n / (packed ? kVec : 1), kThreads), 2048u);
    if (packed)
      amax_tensor_kernel<T, kVec><<<grid, kThreads, 0, ctx.stream>>>(x, n, amax_bits, first_bad);
    else
      amax_tensor_kernel<T, 1><<<grid, kThreads, 0, ctx.stream>>>(x, n, amax_bits, first_bad);
  } else if (scaling == Fp8Scaling::kRow) {
    const unsigned row_grid = static_cast<unsigned>(std::min<int64_t>(rows, 65535));
    if (packed)
      amax_row_kernel<T, kVec><<<row_grid, kThreads, 0, ctx.stream>>>(x, rows, cols, amax_bits, first_bad);
    else
      amax_row_kernel<T, 1><<<row_grid, kThreads, 0, ctx.stream>>>(x, rows, cols, amax_bits, first_bad);
  } else {
    const int64_t width = 32 * (packed ? kVec : 1);
    const int64_t col_blocks = (cols + width - 1) / width, row_blocks = (rows + kColumnRows - 1) / kColumnRows;
    ST_CHECK(col_blocks <= INT_MAX && row_blocks <= 65535, "gpu::fp8_quantize_matrix: ", rows, " x ", cols,
             " has too many rows or columns for the column maxima");
    const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(row_blocks));
    if (packed)
      amax_column_kernel<T, kVec><<<grid, kThreads, 0, ctx.stream>>>(x, rows, cols, amax_bits, first_bad);
    else
      amax_column_kernel<T, 1><<<grid, kThreads, 0, ctx.stream>>>(x, rows, cols, amax_bits, first_bad);
  }
  ST_CUDA_CHECK_LAUNCH();
}

// x's tensorwise maximum folded into *own (not zeroed first), on ctx.stream.
template <typename T>
void enqueue_maxima_folded(const T* x, int64_t n, unsigned* own, const GpuContext& ctx) {
  amax_tensor_kernel<T, 1><<<std::min(grid_for(n, kThreads), 2048u), kThreads, 0, ctx.stream>>>(x, n, own, nullptr);
  ST_CUDA_CHECK_LAUNCH();
}

// Each group's scale (into `scale`) and its inverse, from the maxima.
void enqueue_scales(const unsigned* amax_bits, int64_t groups, Fp8Format f, bool power_of_2, float* scale,
                    float* inverse, const GpuContext& ctx, bool ahead = false) {
  scale_kernel<<<grid_for(groups, kThreads), kThreads, 0, ctx.stream>>>(amax_bits, groups, fp8_max(f), power_of_2,
                                                                        ahead, scale, inverse);
  ST_CUDA_CHECK_LAUNCH();
}

// The grid of the 64 x 64 (wide) or 32 x 32 tiles over x.
dim3 tile_grid(int64_t rows, int64_t cols, int tile) {
  const int64_t row_tiles = (rows + tile - 1) / tile, col_tiles = (cols + tile - 1) / tile;
  ST_CHECK(row_tiles <= INT_MAX && col_tiles <= 65535, "gpu::fp8_quantize_matrix: ", rows, " x ", cols,
           " is too large to transpose");
  return dim3(static_cast<unsigned>(row_tiles), static_cast<unsigned>(col_tiles));
}

// The codes of x with scales already taken, in `layout`; own, when not null, gets x's maximum folded in (by a pass of
// its own for the scalar transposed cast, whose two-dimensional blocks fold none).
template <typename T>
void enqueue_codes(const T* x, int64_t rows, int64_t cols, Fp8Layout layout, bool packed, const Codes& o,
                   const GpuContext& ctx, unsigned* own = nullptr) {
  const int64_t n = rows * cols;
  if (layout == Fp8Layout::kRowMajor) {
    if (packed)
      cast_kernel<T, kVec><<<grid_for(n / kVec, kThreads), kThreads, 0, ctx.stream>>>(x, rows, cols, o, own);
    else
      cast_kernel<T, 1><<<grid_for(n, kThreads), kThreads, 0, ctx.stream>>>(x, rows, cols, o, own);
  } else if (packed && rows % kVec == 0) {  // the codes' rows (x's columns) whole packs too
    cast_transposed_packed_kernel<T><<<tile_grid(rows, cols, kWideTile), kThreads, 0, ctx.stream>>>(
        x, rows, cols, o, Codes{o.s, nullptr, o.format, nullptr}, own);
  } else {
    if (own != nullptr) enqueue_maxima_folded(x, n, own, ctx);
    cast_transposed_kernel<T>
        <<<tile_grid(rows, cols, kTile), dim3(kTile, kTileRows), 0, ctx.stream>>>(x, rows, cols, o);
  }
  ST_CUDA_CHECK_LAUNCH();
}

// A cast's kernels, queued on ctx.stream; first_bad null: no record of non-finite elements. kRow in x's layout is
// one kernel (row_cast_kernel); otherwise the groups' maxima, their scales, then the codes.
template <typename T>
void enqueue_cast(const T* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling, bool power_of_2,
                  Fp8Layout layout, uint8_t* q, float* inverse_scales, const CastScratch& s,
                  unsigned long long* first_bad, const GpuContext& ctx) {
  const bool packed = packed_ok(x, cols, q);
  if (scaling == Fp8Scaling::kRow && layout == Fp8Layout::kRowMajor) {
    const unsigned row_grid = static_cast<unsigned>(std::min<int64_t>(rows, 65535));
    if (packed)
      row_cast_kernel<T, kVec><<<row_grid, kRowThreads, 0, ctx.stream>>>(
          x, rows, cols, fp8_max(f), power_of_2, interpretation(f), inverse_scales, q, first_bad);
    else
      row_cast_kernel<T, 1><<<row_grid, kRowThreads, 0, ctx.stream>>>(x, rows, cols, fp8_max(f), power_of_2,
                                                                      interpretation(f), inverse_scales, q, first_bad);
    ST_CUDA_CHECK_LAUNCH();
    return;
  }
  enqueue_maxima(x, rows, cols, scaling, packed, s.amax_bits, first_bad, ctx);
  enqueue_scales(s.amax_bits, fp8_groups(scaling, rows, cols), f, power_of_2, s.scale, inverse_scales, ctx);
  enqueue_codes(x, rows, cols, layout, packed, Codes{scaling, s.scale, interpretation(f), q}, ctx);
}

// fp8_quantize_pair_async's kernels; with `maxima` (both casts grouped alike) they take those instead of a pass.
template <typename T>
void enqueue_pair(const T* x, int64_t rows, int64_t cols, bool power_of_2, const Fp8Cast& row_major,
                  const Fp8Cast& transposed, const unsigned* maxima, const GpuContext& ctx) {
  const int64_t ga = fp8_groups(row_major.scaling, rows, cols), gb = fp8_groups(transposed.scaling, rows, cols);
  const CastScratch s = cast_scratch(ctx, rows, cols, ga + gb);
  if (rows * cols == 0) return;
  const bool packed = packed_ok(x, cols, row_major.q) && packed_ok(x, cols, transposed.q) && rows % kVec == 0;
  // Both casts grouped alike share one pass over x for their maxima (or none, given them); their scales differ only
  // by format.
  const bool shared = row_major.scaling == transposed.scaling;
  const unsigned* amax_a = maxima != nullptr ? maxima : s.amax_bits;
  const unsigned* amax_b = shared ? amax_a : s.amax_bits + ga;
  if (maxima == nullptr) enqueue_maxima(x, rows, cols, row_major.scaling, packed, s.amax_bits, nullptr, ctx);
  if (!shared) enqueue_maxima(x, rows, cols, transposed.scaling, packed, s.amax_bits + ga, nullptr, ctx);
  enqueue_scales(amax_a, ga, row_major.format, power_of_2, s.scale, row_major.inverse_scales, ctx);
  enqueue_scales(amax_b, gb, transposed.format, power_of_2, s.scale + ga, transposed.inverse_scales, ctx);
  const Codes a{row_major.scaling, s.scale, interpretation(row_major.format), row_major.q};
  const Codes b{transposed.scaling, s.scale + ga, interpretation(transposed.format), transposed.q};
  if (packed) {  // one read of x for both
    cast_transposed_packed_kernel<T>
        <<<tile_grid(rows, cols, kWideTile), kThreads, 0, ctx.stream>>>(x, rows, cols, b, a, nullptr);
    ST_CUDA_CHECK_LAUNCH();
  } else {
    enqueue_codes(x, rows, cols, Fp8Layout::kRowMajor, false, a, ctx);
    enqueue_codes(x, rows, cols, Fp8Layout::kTransposed, false, b, ctx);
  }
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

template <typename T>
void fp8_maxima_async(const T* x, int64_t rows, int64_t cols, Fp8Scaling scaling, unsigned* maxima,
                      const GpuContext& ctx) {
  ST_CHECK(rows >= 0 && cols >= 0, "gpu::fp8_maxima: ", rows, " x ", cols);
  const int64_t groups = fp8_groups(scaling, rows, cols);
  if (rows * cols == 0) {
    ST_CUDA_CHECK(cudaMemsetAsync(maxima, 0, static_cast<size_t>(groups) * sizeof(unsigned), ctx.stream));
    return;
  }
  enqueue_maxima(x, rows, cols, scaling, packed_ok<T>(x, cols, nullptr), maxima, nullptr, ctx);
}

template <typename T>
void fp8_quantize_with_maxima_async(const T* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling,
                                    bool power_of_2, Fp8Layout layout, const unsigned* maxima, uint8_t* q,
                                    float* inverse_scales, const GpuContext& ctx) {
  const int64_t groups = fp8_groups(scaling, rows, cols);
  const CastScratch s = cast_scratch(ctx, rows, cols, groups);
  if (rows * cols == 0) return;
  enqueue_scales(maxima, groups, f, power_of_2, s.scale, inverse_scales, ctx);
  enqueue_codes(x, rows, cols, layout, packed_ok(x, cols, q), Codes{scaling, s.scale, interpretation(f), q}, ctx);
}

template <typename T>
void fp8_quantize_pair_async(const T* x, int64_t rows, int64_t cols, bool power_of_2, const Fp8Cast& row_major,
                             const Fp8Cast& transposed, const GpuContext& ctx) {
  enqueue_pair(x, rows, cols, power_of_2, row_major, transposed, nullptr, ctx);
}

template <typename T>
void fp8_quantize_pair_with_maxima_async(const T* x, int64_t rows, int64_t cols, bool power_of_2,
                                         const Fp8Cast& row_major, const Fp8Cast& transposed, const unsigned* maxima,
                                         const GpuContext& ctx) {
  ST_CHECK(row_major.scaling == transposed.scaling, "gpu::fp8_quantize_pair_with_maxima: the casts group differently");
  enqueue_pair(x, rows, cols, power_of_2, row_major, transposed, maxima, ctx);
}

template <typename T>
void fp8_quantize_ahead_async(const T* x, int64_t rows, int64_t cols, Fp8Format f, const unsigned* amax, uint8_t* q,
                              uint8_t* q_t, float* inverse_scale, unsigned* own, const GpuContext& ctx) {
  const CastScratch s = cast_scratch(ctx, rows, cols, 1);
  enqueue_scales(amax, 1, f, false, s.scale, inverse_scale, ctx, /*ahead=*/true);
  if (rows * cols == 0) return;
  if (q == nullptr && q_t == nullptr) {
    if (own != nullptr) enqueue_maxima_folded(x, rows * cols, own, ctx);
    return;
  }
  const Codes row{Fp8Scaling::kTensor, s.scale, interpretation(f), q, /*nan_codes=*/true};
  const Codes t{Fp8Scaling::kTensor, s.scale, interpretation(f), q_t, /*nan_codes=*/true};
  const bool packed = packed_ok(x, cols, q) && packed_ok(x, cols, q_t);
  if (q_t == nullptr) {
    enqueue_codes(x, rows, cols, Fp8Layout::kRowMajor, packed, row, ctx, own);
  } else if (packed && rows % kVec == 0) {  // one read of x for both (or for q_t alone), folding its maximum
    cast_transposed_packed_kernel<T>
        <<<tile_grid(rows, cols, kWideTile), kThreads, 0, ctx.stream>>>(x, rows, cols, t, row, own);
    ST_CUDA_CHECK_LAUNCH();
  } else {
    if (q != nullptr) enqueue_codes(x, rows, cols, Fp8Layout::kRowMajor, false, row, ctx, own);
    enqueue_codes(x, rows, cols, Fp8Layout::kTransposed, false, t, ctx, q != nullptr ? nullptr : own);
  }
}

namespace {

// One thread a tensor: the largest of its parts' maxima, and its inverse scale as scale_kernel computes it.
__global__ void scales_of_parts_kernel(const unsigned* maxima, int world, int64_t k, float fp8_max, bool power_of_2,
                                       unsigned* out_maxima, float* inverse) {
  for (int64_t t = thread_index(); t < k; t += thread_count()) {
    unsigned m = 0;
    for (int r = 0; r < world; ++r) m = max(m, maxima[r * k + t]);
    out_maxima[t] = m;
    inverse[t] = __fdiv_rn(1.0f, scale_of(m, fp8_max, power_of_2));
  }
}

// cast_transposed_kernel's tiles on codes: a 32 x 32 tile of q read along its rows, written along the rows of out.
__global__ void __launch_bounds__(kTile* kTileRows)
    transpose_codes_kernel(const uint8_t* q, int64_t rows, int64_t cols, uint8_t* out) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kTile, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t c = c0 + threadIdx.x;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t r = r0 + i;
    if (r < rows && c < cols) tile[threadIdx.x][i] = q[r * cols + c];
  }
  __syncthreads();
  const int64_t r = r0 + threadIdx.x;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t cc = c0 + i;
    if (r < rows && cc < cols) out[cc * rows + r] = tile[i][threadIdx.x];
  }
}

}  // namespace

void fp8_scales_of_parts(const unsigned* maxima, int world, int64_t k, Fp8Format f, bool power_of_2,
                         unsigned* out_maxima, float* inverse_scales, const GpuContext& ctx) {
  ST_CHECK(world >= 1 && k >= 0, "gpu::fp8_scales_of_parts: world ", world, ", k ", k);
  if (k == 0) return;
  scales_of_parts_kernel<<<grid_for(k, kThreads), kThreads, 0, ctx.stream>>>(maxima, world, k, fp8_max(f), power_of_2,
                                                                             out_maxima, inverse_scales);
  ST_CUDA_CHECK_LAUNCH();
}

void fp8_transpose(const uint8_t* q, int64_t rows, int64_t cols, uint8_t* out, const GpuContext& ctx) {
  ST_CHECK(rows >= 0 && cols >= 0, "gpu::fp8_transpose: ", rows, " x ", cols);
  if (rows * cols == 0) return;
  transpose_codes_kernel<<<tile_grid(rows, cols, kTile), dim3(kTile, kTileRows), 0, ctx.stream>>>(q, rows, cols, out);
  ST_CUDA_CHECK_LAUNCH();
}

#define ST_INSTANTIATE_FP8_CAST(T)                                                                                    \
  template void fp8_quantize_matrix<T>(const T*, int64_t, int64_t, Fp8Format, Fp8Scaling, bool, Fp8Layout, uint8_t*,  \
                                       float*, const std::string&, const GpuContext&);                                \
  template void fp8_quantize_matrix_async<T>(const T*, int64_t, int64_t, Fp8Format, Fp8Scaling, bool, Fp8Layout,      \
                                             uint8_t*, float*, const GpuContext&);                                    \
  template void fp8_quantize_pair_async<T>(const T*, int64_t, int64_t, bool, const Fp8Cast&, const Fp8Cast&,          \
                                           const GpuContext&);                                                        \
  template void fp8_quantize_pair_with_maxima_async<T>(const T*, int64_t, int64_t, bool, const Fp8Cast&,              \
                                                       const Fp8Cast&, const unsigned*, const GpuContext&);           \
  template void fp8_maxima_async<T>(const T*, int64_t, int64_t, Fp8Scaling, unsigned*, const GpuContext&);            \
  template void fp8_quantize_with_maxima_async<T>(const T*, int64_t, int64_t, Fp8Format, Fp8Scaling, bool, Fp8Layout, \
                                                  const unsigned*, uint8_t*, float*, const GpuContext&);              \
  template void fp8_quantize_ahead_async<T>(const T*, int64_t, int64_t, Fp8Format, const unsigned*, uint8_t*,         \
                                            uint8_t*, float*, unsigned*, const GpuContext&);

ST_INSTANTIATE_FP8_CAST(float)
ST_INSTANTIATE_FP8_CAST(bf16)
#undef ST_INSTANTIATE_FP8_CAST

}  // namespace st::gpu
