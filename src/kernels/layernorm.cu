#include "shardtrain/kernels/gpu/layernorm.h"

#include <algorithm>
#include <type_traits>

#include "gpu_pack.cuh"
#include "shardtrain/kernels/gpu/column_sums.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

// Forward and dinp: one warp per row, kRowsPerBlock rows per block.
constexpr int kRowsPerBlock = 8;
constexpr int kRowBlock = kRowsPerBlock * kWarpSize;

// Row kernels that keep a whole row in registers, kPacks packs of kVec per lane (lane l has packs l, l + 32, ...):
// up to kMaxRowPacks, i.e. C <= 2560 in bf16/fp16 and C <= 1280 in fp32 when packed. Instantiated for the pack
// counts of row_pack_tiers (a row of fewer packs runs in the next larger tier; the missing packs are skipped).
constexpr int kMaxRowPacks = 10;

// Calls f(Width<P>()) for the smallest instantiated P >= packs (1 <= packs <= kMaxRowPacks). The tiers are
// GPT-2's widths in bf16: 768 (3 packs a lane), 1024 (4), 1600 (7), 2560 (10).
template <typename F>
void row_pack_tiers(int packs, F&& f) {
  if (packs <= 2)
    f(Width<2>());
  else if (packs <= 3)
    f(Width<3>());
  else if (packs <= 4)
    f(Width<4>());
  else if (packs <= 7)
    f(Width<7>());
  else
    f(Width<kMaxRowPacks>());
}

// dweight/dbias are summed per chunk of rows into part_w/part_b[chunk, C], then over chunks in order
// (finish_column_sums_pair). Chunks are a function of N alone (never of the device), so the summation tree, and
// with it every bit of the result, is the same on every run and every GPU. About 512 chunks
// (layernorm_backward_chunks, scratch_sizes.h): one block of the fused backward each. 512 is about one wave of the
// fused kernel on an H200 at GPT-2's widths (132 SMs x 5 blocks at C = 768, x 3 at C = 1024), and the partials (2 *
// chunks * C floats, written and read back through L2) stay ~4% of the rows' traffic. In bench_layernorm's sweep 512
// and 384 are the best; fewer chunks leave SMs idle, more start a second, partial wave (docs/performance.md,
// "Kernels"). Rows per chunk are a multiple of kFusedWarps so the fused block's warps get equal shares.

// Fused backward: blocks of kFusedWarps warps (one row per warp at a time).
constexpr int kFusedWarps = kLayernormFusedWarps;
constexpr int kFusedThreads = kFusedWarps * kWarpSize;

int64_t chunk_rows(int64_t N) { return layernorm_backward_chunk_rows(N); }
int64_t num_chunks(int64_t N) { return layernorm_backward_chunks(N); }

// dweight/dbias of the two-kernel backward: a block covers kWarpSize packs of columns and one chunk of rows, with
// kRowLanes threads down the rows.
constexpr int kRowLanes = 8;

__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char st_layernorm_smem[];
  return st_layernorm_smem;
}

// amax, when not null: out's maximum folded in (MaximumFold), as in layernorm_forward_rows_kernel.
template <int kVec, typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                                         int64_t N, int C, unsigned* amax) {
  MaximumFold fold{amax};
  const int lane = threadIdx.x % kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  // The row loop is uniform over a warp, so the shuffles below see all 32 lanes.
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize; n < N; n += nwarps) {
    const T* x = inp + n * C;
    float s = 0;
    for_each_pack<kVec>(C, lane, kWarpSize, [&](int64_t c, auto w) {
      constexpr int W = decltype(w)::value;
      float v[W];
      load<W>(x + c, v);
      for (int k = 0; k < W; ++k) s += v[k];
    });
    const float m = warp_reduce(s, Add()) / C;
    // Two-pass variance, as the reference: no cancellation for rows with a large mean. The re-reads of
    // the row hit L1.
    float ss = 0;
    for_each_pack<kVec>(C, lane, kWarpSize, [&](int64_t c, auto w) {
      constexpr int W = decltype(w)::value;
      float v[W];
      load<W>(x + c, v);
      for (int k = 0; k < W; ++k) ss += (v[k] - m) * (v[k] - m);
    });
    const float r = 1.0f / sqrtf(warp_reduce(ss, Add()) / C + kLayerNormEps);
    for_each_pack<kVec>(C, lane, kWarpSize, [&](int64_t c, auto w) {
      constexpr int W = decltype(w)::value;
      float v[W], wt[W], b[W];
      load<W>(x + c, v);
      load<W>(weight + c, wt);
      load<W>(bias + c, b);
      for (int k = 0; k < W; ++k) v[k] = (v[k] - m) * r * wt[k] + b[k];
      fold.store<W>(out + n * C + c, v);
    });
    if (lane == 0) {
      mean[n] = m;
      rstd[n] = r;
    }
  }
  fold.finish();
}

template <int kVec, typename T>
__global__ void layernorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight, const float* mean,
                                               const float* rstd, int64_t N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize; n < N; n += nwarps) {
    const T* x = inp + n * C;
    const T* d = dout + n * C;
    const float m = mean[n], r = rstd[n];
    float sum_dn = 0, sum_dn_norm = 0;
    for_each_pack<kVec>(C, lane, kWarpSize, [&](int64_t c, auto w) {
      constexpr int W = decltype(w)::value;
      float xv[W], dv[W], wt[W];
      load<W>(x + c, xv);
      load<W>(d + c, dv);
      load<W>(weight + c, wt);
      for (int k = 0; k < W; ++k) {
        const float dn = wt[k] * dv[k];
        sum_dn += dn;
        sum_dn_norm += dn * ((xv[k] - m) * r);
      }
    });
    const float mean_dn = warp_reduce(sum_dn, Add()) / C;
    const float mean_dn_norm = warp_reduce(sum_dn_norm, Add()) / C;
    for_each_pack<kVec>(C, lane, kWarpSize, [&](int64_t c, auto w) {
      constexpr int W = decltype(w)::value;
      float xv[W], dv[W], wt[W], g[W];
      load<W>(x + c, xv);
      load<W>(d + c, dv);
      load<W>(weight + c, wt);
      load<W>(dinp + n * C + c, g);
      for (int k = 0; k < W; ++k) {
        const float norm = (xv[k] - m) * r;
        g[k] += (wt[k] * dv[k] - mean_dn - norm * mean_dn_norm) * r;
      }
      store<W>(dinp + n * C + c, g);
    });
  }
}

// Block (kWarpSize, kRowLanes), grid (column tiles, chunks): partial sums of norm * dout and dout over one
// chunk of rows, for kWarpSize * kVec columns, written to part_w/part_b[chunk, C]. kVec divides C.
template <int kVec, typename T>
__global__ void layernorm_backward_partials_kernel(float* part_w, float* part_b, const T* dout, const T* inp,
                                                   const float* mean, const float* rstd, int64_t N, int C,
                                                   int64_t rows_per_chunk) {
  __shared__ float sh_w[kRowLanes][kWarpSize * kVec];
  __shared__ float sh_b[kRowLanes][kWarpSize * kVec];
  const int c = (blockIdx.x * kWarpSize + threadIdx.x) * kVec;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(N, r0 + rows_per_chunk);
  float acc_w[kVec] = {}, acc_b[kVec] = {};
  if (c < C) {
    for (int64_t n = r0 + threadIdx.y; n < r1; n += kRowLanes) {
      float xv[kVec], dv[kVec];
      load<kVec>(inp + n * C + c, xv);
      load<kVec>(dout + n * C + c, dv);
      const float m = mean[n], r = rstd[n];
      for (int k = 0; k < kVec; ++k) {
        acc_w[k] += ((xv[k] - m) * r) * dv[k];
        acc_b[k] += dv[k];
      }
    }
  }
  for (int k = 0; k < kVec; ++k) {
    sh_w[threadIdx.y][threadIdx.x * kVec + k] = acc_w[k];
    sh_b[threadIdx.y][threadIdx.x * kVec + k] = acc_b[k];
  }
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int k = 0; k < kVec; ++k) {
    float w = 0, b = 0;
    for (int y = 0; y < kRowLanes; ++y) {
      w += sh_w[y][threadIdx.x * kVec + k];
      b += sh_b[y][threadIdx.x * kVec + k];
    }
    part_w[static_cast<int64_t>(blockIdx.y) * C + c + k] = w;
    part_b[static_cast<int64_t>(blockIdx.y) * C + c + k] = b;
  }
}

// A row's packs [0, kPacks) of this lane, raw (T, not yet fp32: half the registers for half types); packs past C
// are left unread.
template <int kVec, int kPacks, typename T>
struct RowPacks {
  Pack<T, kVec> p[kPacks];

  __device__ __forceinline__ void load(const T* row, int lane, int C) {
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int c = column(i, lane);
      if (c < C) p[i] = *reinterpret_cast<const Pack<T, kVec>*>(row + c);
    }
  }
  __device__ __forceinline__ float at(int i, int k) const { return to_f32(p[i].v[k]); }
  // Makes the packs opaque to the compiler, so that fp32 values converted from them before this point are not
  // kept alive for uses after it: without it, the fused backward held its whole row as fp32 across the row
  // reductions (twice the registers, and spills in bf16) instead of converting again, which costs a shift.
  __device__ __forceinline__ void reconvert_after() {
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      unsigned* words = reinterpret_cast<unsigned*>(p[i].v);
#pragma unroll
      for (int j = 0; j < static_cast<int>(sizeof(p[i]) / sizeof(unsigned)); ++j) asm volatile("" : "+r"(words[j]));
    }
  }
  // First column of pack i of `lane`.
  static __device__ __forceinline__ int column(int i, int lane) { return (i * kWarpSize + lane) * kVec; }
};

// Forward for packed rows of up to kPacks packs a lane: one warp per row, as layernorm_forward_kernel, but the row
// is loaded once, every pack's load in flight at once, and both passes of the (two-pass) variance read it from
// registers. The sums run over the same packs and elements in the same order as layernorm_forward_kernel's, so
// the results are bit-identical to it. amax, when not null: out's maximum folded in (MaximumFold).
template <int kVec, int kPacks, typename T>
__global__ void __launch_bounds__(kRowBlock)
    layernorm_forward_rows_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                                  int64_t N, int C, unsigned* amax) {
  wait_for_predecessor();  // launched by launch_after_predecessor
  MaximumFold fold{amax};
  using Row = RowPacks<kVec, kPacks, T>;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize; n < N; n += nwarps) {
    Row x;
    x.load(inp + n * C, lane, C);
    float s = 0;
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      if (Row::column(i, lane) >= C) continue;
#pragma unroll
      for (int k = 0; k < kVec; ++k) s += x.at(i, k);
    }
    x.reconvert_after();
    const float m = warp_reduce(s, Add()) / C;
    float ss = 0;
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      if (Row::column(i, lane) >= C) continue;
#pragma unroll
      for (int k = 0; k < kVec; ++k) ss += (x.at(i, k) - m) * (x.at(i, k) - m);
    }
    x.reconvert_after();
    const float r = 1.0f / sqrtf(warp_reduce(ss, Add()) / C + kLayerNormEps);
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int c = Row::column(i, lane);
      if (c >= C) continue;
      float v[kVec], wt[kVec], b[kVec];
      load<kVec>(weight + c, wt);
      load<kVec>(bias + c, b);
#pragma unroll
      for (int k = 0; k < kVec; ++k) v[k] = (x.at(i, k) - m) * r * wt[k] + b[k];
      fold.store<kVec>(out + n * C + c, v);
    }
    if (lane == 0) {
      mean[n] = m;
      rstd[n] = r;
    }
  }
  fold.finish();
}

// Shared memory of the fused backward: each warp owns a [2][slots] float4 slice (sums of norm * dout, then of
// dout), slots = packs a lane * kVec / 4 * 32, and after all the slices a [3][slots * 4] T staging area (a row of
// inp, of dout and of dinp). A lane's kVec columns of pack i are float4s (i * kVec / 4 + q) * 32 +
// lane, q in [0, kVec / 4): a warp's float4 accesses are then 32 consecutive float4s, free of bank conflicts
// (indexing by column would put lanes 32 bytes apart, two-way conflicts).
__host__ __device__ inline int fused_slots(int C, int kVec) {
  return (C / kVec + kWarpSize - 1) / kWarpSize * (kVec / 4) * kWarpSize;
}
inline size_t fused_smem_bytes(int C, int kVec, size_t elem_bytes) {
  return static_cast<size_t>(kFusedWarps) * fused_slots(C, kVec) * (2 * sizeof(float4) + 3 * 4 * elem_bytes);
}
// Blocks an H200 SM (228 KB of shared memory, 1 KB of it reserved per block) holds at C = kPacks * 32 * kVec, at
// most 8 (32 warps): the register budget __launch_bounds__ gives the fused kernel, so registers never limit
// occupancy below what shared memory allows.
constexpr int fused_min_blocks(int packs, int vec, int elem_bytes) {
  const int kb = kFusedWarps * (2 * 4 + 3 * elem_bytes) * packs * vec * kWarpSize / 1024 + 1;
  return 228 / kb < 8 ? 228 / kb : 8;
}

// Fused backward for packed half-precision rows of up to kPacks packs a lane (C <= 2560 in bf16/fp16): dinp and the
// chunk's partial dweight/dbias in one pass over inp and dout, instead of two kernels that each read them.
//
// Block = kFusedWarps warps over one chunk of rows; a warp takes rows warp, warp + kFusedWarps, ... of the chunk,
// its lanes always the same columns. Its row stays in registers between the two halves (raw T: 32 registers a
// lane at C = 1024), and its column sums go to the warp's private shared slice, not registers (sums in registers
// took 114 of them and held 16 warps an SM).
//
// kStage: the memory is read ahead by cp.async into the warp's staging area, not registers: the next row's inp and
// dout while this row is worked on, and this row's dinp while its sums and reductions run, so a warp always has a
// row in flight. Without it (kStage = false: the same sums in the same order, for GPUs that cannot give a block
// the staging area's shared memory) the warp waits on each row's loads: ncu shows the long-scoreboard stalls, which
// the staging cuts, raising the DRAM throughput and shortening the kernel at every width (docs/performance.md,
// "Kernels").
//
// No atomics: each lane adds its own columns, one row after another, so each slice entry is a fixed sequence of
// additions. After the rows, the block adds the warps' slices in warp order and writes part_w/part_b[chunk, C] for
// finish_column_sums_pair. The sum tree depends on N and C alone.
template <int kVec, int kPacks, bool kStage, typename T>
__global__ void __launch_bounds__(kFusedThreads, fused_min_blocks(kPacks, kVec, kStage ? sizeof(T) : 0))
    layernorm_backward_fused_kernel(T* dinp, float* part_w, float* part_b, const T* dout, const T* inp, const T* weight,
                                    const float* mean, const float* rstd, int64_t N, int C, int64_t rows_per_chunk) {
  static_assert(kVec % 4 == 0, "slices hold float4s");
  wait_for_predecessor();  // launched by launch_after_predecessor
  constexpr int kQuads = kVec / 4;
  using Row = RowPacks<kVec, kPacks, T>;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int slots = fused_slots(C, kVec);
  float4* const smem = reinterpret_cast<float4*>(dynamic_smem());
  float4* const sum_w = smem + warp * 2 * slots;
  float4* const sum_b = sum_w + slots;
  const auto slot = [&](int i, int q) { return (i * kQuads + q) * kWarpSize + lane; };
  // Staging (kStage): this warp's [3][row] of T after all warps' slices: inp and dout of its next row, dinp of
  // this one.
  const int row_elems = slots * 4;  // packs a lane * kWarpSize * kVec
  T* const stage_x = reinterpret_cast<T*>(smem + kFusedWarps * 2 * slots) + warp * 3 * row_elems;
  T* const stage_d = stage_x + row_elems;
  T* const stage_g = stage_d + row_elems;
  // Each lane copies exactly the packs it reads later, so its own cp.async waits order them; no barrier.
  const auto stage = [&](T* dst, const T* src) {
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int c = Row::column(i, lane);
      if (c < C) cp_async_16(dst + c, src + c);
    }
  };
  // Only this lane touches its slots until the block-wide sum, so no barrier before the rows.
#pragma unroll
  for (int i = 0; i < kPacks; ++i) {
    if (Row::column(i, lane) >= C) continue;
#pragma unroll
    for (int q = 0; q < kQuads; ++q) sum_w[slot(i, q)] = sum_b[slot(i, q)] = make_float4(0, 0, 0, 0);
  }

  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_chunk;
  const int64_t r1 = min(N, r0 + rows_per_chunk);
  if constexpr (kStage) {
    if (r0 + warp < r1) {
      stage(stage_x, inp + (r0 + warp) * C);
      stage(stage_d, dout + (r0 + warp) * C);
    }
    cp_async_commit();
  }
  for (int64_t n = r0 + warp; n < r1; n += kFusedWarps) {
    Row x, d;
    if constexpr (kStage) {
      // Groups in flight here: this row's inp and dout. Then two a row: its dinp, and the next row's inp and dout
      // (committed even when empty, so that cp_async_wait<1> below always means "this row's dinp").
      cp_async_wait<0>();
      x.load(stage_x, lane, C);
      d.load(stage_d, lane, C);
      __syncwarp();  // the loads above complete before the copies below overwrite their source
      stage(stage_g, dinp + n * C);
      cp_async_commit();
      if (n + kFusedWarps < r1) {
        stage(stage_x, inp + (n + kFusedWarps) * C);
        stage(stage_d, dout + (n + kFusedWarps) * C);
      }
      cp_async_commit();
    } else {
      x.load(inp + n * C, lane, C);
      d.load(dout + n * C, lane, C);
    }
    const float m = mean[n], r = rstd[n];
    float sum_dn = 0, sum_dn_norm = 0;
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int c = Row::column(i, lane);
      if (c >= C) continue;
      float wt[kVec];
      load<kVec>(weight + c, wt);
#pragma unroll
      for (int q = 0; q < kQuads; ++q) {
        float4 w4 = sum_w[slot(i, q)], b4 = sum_b[slot(i, q)];
        float* w = &w4.x;
        float* b = &b4.x;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int k = q * 4 + j;
          const float norm = (x.at(i, k) - m) * r;
          w[j] += norm * d.at(i, k);
          b[j] += d.at(i, k);
          const float dn = d.at(i, k) * wt[k];
          sum_dn += dn;
          sum_dn_norm += dn * norm;
        }
        sum_w[slot(i, q)] = w4;
        sum_b[slot(i, q)] = b4;
      }
    }
    x.reconvert_after();
    d.reconvert_after();
    const float mean_dn = warp_reduce(sum_dn, Add()) / C;
    const float mean_dn_norm = warp_reduce(sum_dn_norm, Add()) / C;
    if constexpr (kStage) cp_async_wait<1>();  // this row's dinp; the next row's inp and dout may be in flight
#pragma unroll
    for (int i = 0; i < kPacks; ++i) {
      const int c = Row::column(i, lane);
      if (c >= C) continue;
      float wt[kVec], g[kVec];
      load<kVec>(weight + c, wt);
      load<kVec>((kStage ? stage_g : dinp + n * C) + c, g);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float norm = (x.at(i, k) - m) * r;
        g[k] += (d.at(i, k) * wt[k] - mean_dn - norm * mean_dn_norm) * r;
      }
      store<kVec>(dinp + n * C + c, g);
    }
    if constexpr (kStage) __syncwarp();  // stage_g read before the next row's copies overwrite it
  }
  __syncthreads();

  // Thread t takes column quads t, t + blockDim.x, ... of dweight then dbias (coalesced writes), each the sum of
  // the warps' slices in warp order.
  const int quads = C / 4;
  for (int j = threadIdx.x; j < 2 * quads; j += blockDim.x) {
    const int which = j < quads ? 0 : 1;  // 0: dweight, 1: dbias
    const int c = (j - which * quads) * 4;
    const int pack = c / kVec;
    const int s = ((pack / kWarpSize) * kQuads + c % kVec / 4) * kWarpSize + pack % kWarpSize + which * slots;
    float4 t = smem[s];
    for (int w = 1; w < kFusedWarps; ++w) {
      const float4 u = smem[w * 2 * slots + s];
      t = make_float4(t.x + u.x, t.y + u.y, t.z + u.z, t.w + u.w);
    }
    float* part = which == 0 ? part_w : part_b;
    *reinterpret_cast<float4*>(part + static_cast<int64_t>(blockIdx.x) * C + c) = t;
  }
}

}  // namespace

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int64_t N, int C,
                       const GpuContext& ctx, unsigned* amax) {
  if (N == 0 || C == 0) return;
  constexpr int kVec = 16 / sizeof(T);
  const unsigned grid = grid_for(N, kRowsPerBlock);
  // With C a multiple of kVec, aligned base pointers give aligned rows.
  const bool vec = C % kVec == 0 && all_aligned(16, out, inp, weight, bias);
  const int packs = (C / kVec + kWarpSize - 1) / kWarpSize;  // a lane's, when vec
  if (vec && packs <= kMaxRowPacks) {
    row_pack_tiers(packs, [&](auto packs_c) {
      launch_after_predecessor(layernorm_forward_rows_kernel<kVec, decltype(packs_c)::value, T>, grid, kRowBlock, 0,
                               ctx.stream, out, mean, rstd, inp, weight, bias, N, C, amax);
    });
    return;
  }
  launch_packed<T>(vec, [&](auto w) {
    layernorm_forward_kernel<decltype(w)::value>
        <<<grid, kRowBlock, 0, ctx.stream>>>(out, mean, rstd, inp, weight, bias, N, C, amax);
  });
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const float* mean,
                        const float* rstd, int64_t N, int C, const GpuContext& ctx, GradWrite param_write,
                        RowStaging staging) {
  if (N == 0 || C == 0) return;
  ST_CHECK((dweight == nullptr) == (dbias == nullptr), "layernorm_backward: weight and bias are frozen together");
  const bool frozen = dweight == nullptr;
  ColumnSums* const deferred = ctx.column_sums;
  const size_t need = layernorm_backward_scratch_bytes(N, C);
  ST_CHECK(deferred != nullptr || (ctx.scratch != nullptr && ctx.scratch_bytes >= need), "layernorm_backward needs ",
           need, " bytes of scratch, ctx has ", ctx.scratch_bytes);
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = C % kVec == 0 && all_aligned(16, dinp, dout, inp, weight);

  const int64_t chunks = num_chunks(N);
  float* part_w = deferred ? deferred->reserve(2 * chunks * C) : static_cast<float*>(ctx.scratch);
  float* part_b = part_w + chunks * C;
  const int packs = (C / kVec + kWarpSize - 1) / kWarpSize;  // a lane's, when vec
  // fp32 rows keep the two kernels: in registers they would take twice the registers of a half row.
  bool fused = false;
  if constexpr (!std::is_same_v<T, float>) {
    fused = vec && packs <= kMaxRowPacks;
    if (fused) {
      // Without staging at most 80 KB (C = 2560), which every GPU from sm_80 on allows a block: whether this path
      // runs never depends on the device, nor, therefore, does the sum order. Staging (up to 140 KB) does not
      // change the sums.
      const size_t staged_smem = fused_smem_bytes(C, kVec, sizeof(T));
      const size_t limit = smem_per_block_optin();
      ST_CHECK(staging != RowStaging::kStaged || staged_smem <= limit,
               "layernorm_backward: RowStaging::kStaged at C = ", C, " needs ", staged_smem,
               " bytes of shared memory a block; the device allows ", limit);
      const bool staged = staging == RowStaging::kStaged || (staging == RowStaging::kAuto && staged_smem <= limit);
      const size_t smem = staged ? staged_smem : fused_smem_bytes(C, kVec, 0);
      row_pack_tiers(packs, [&](auto packs_c) {
        constexpr int P = decltype(packs_c)::value;
        const auto kernel = staged ? layernorm_backward_fused_kernel<kVec, P, true, T>
                                   : layernorm_backward_fused_kernel<kVec, P, false, T>;
        ST_CUDA_CHECK(
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
        ST_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                           cudaSharedmemCarveoutMaxShared));
        launch_after_predecessor(kernel, static_cast<unsigned>(chunks), kFusedThreads, smem, ctx.stream, dinp, part_w,
                                 part_b, dout, inp, weight, mean, rstd, N, C, chunk_rows(N));
      });
    }
  }
  if (!fused) {
    const unsigned grid = grid_for(N, kRowsPerBlock);
    launch_packed<T>(vec, [&](auto w) {
      layernorm_backward_dinp_kernel<decltype(w)::value>
          <<<grid, kRowBlock, 0, ctx.stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
    });
    if (frozen) return;
    const dim3 block(kWarpSize, kRowLanes);
    launch_packed<T>(vec, [&](auto w) {
      constexpr int W = decltype(w)::value;
      const dim3 tiles((C / W + kWarpSize - 1) / kWarpSize, static_cast<unsigned>(chunks));
      layernorm_backward_partials_kernel<W>
          <<<tiles, block, 0, ctx.stream>>>(part_w, part_b, dout, inp, mean, rstd, N, C, chunk_rows(N));
    });
  }
  // A frozen weight and bias still run the fused kernel, whose partials are then dropped: dinp keeps the bits of
  // the trained case, and the partials are a small part of its traffic.
  if (frozen) return;
  if (deferred) {
    deferred->queue(dweight, part_w, chunks, C, param_write);
    deferred->queue(dbias, part_b, chunks, C, param_write);
  } else {
    finish_column_sums_pair(dweight, part_w, dbias, part_b, chunks, C, ctx.stream, param_write);
  }
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int64_t, int,
                                       const GpuContext&, unsigned*);
template void layernorm_forward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*, int64_t, int,
                                      const GpuContext&, unsigned*);
template void layernorm_forward<fp16>(fp16*, float*, float*, const fp16*, const fp16*, const fp16*, int64_t, int,
                                      const GpuContext&, unsigned*);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                        const float*, int64_t, int, const GpuContext&, GradWrite, RowStaging);
template void layernorm_backward<bf16>(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*, const float*,
                                       const float*, int64_t, int, const GpuContext&, GradWrite, RowStaging);
template void layernorm_backward<fp16>(fp16*, fp16*, fp16*, const fp16*, const fp16*, const fp16*, const float*,
                                       const float*, int64_t, int, const GpuContext&, GradWrite, RowStaging);

}  // namespace st::gpu
