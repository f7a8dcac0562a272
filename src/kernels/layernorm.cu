#include <algorithm>
#include <type_traits>

#include "gpu_pack.cuh"
#include "shardtrain/kernels/gpu/layernorm.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

// Forward and dinp: one warp per row, kRowsPerBlock rows per block.
constexpr int kRowsPerBlock = 8;
constexpr int kRowBlock = kRowsPerBlock * kWarpSize;

// dweight/dbias: a block covers kWarpSize packs of columns and one chunk of rows, with kRowLanes threads
// down the rows. Chunks are a function of N alone (never of the device), so the summation tree, and with
// it every bit of the result, is the same on every run and every GPU.
constexpr int kRowLanes = 8;
constexpr int64_t kMaxChunks = 256;
constexpr int64_t kMinChunkRows = 32;

int64_t chunk_rows(int64_t N) { return std::max(kMinChunkRows, (N + kMaxChunks - 1) / kMaxChunks); }

// Packs per lane of the fused backward: it covers C <= kMaxFusedPacks * 32 * kVec.
constexpr int kMaxFusedPacks = 4;

__device__ __forceinline__ unsigned char* dynamic_smem() {
  extern __shared__ __align__(16) unsigned char st_layernorm_smem[];
  return st_layernorm_smem;
}
int64_t num_chunks(int64_t N) { return (N + chunk_rows(N) - 1) / chunk_rows(N); }

template <int kVec, typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias,
                                         int64_t N, int C) {
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
      store<W>(out + n * C + c, v);
    });
    if (lane == 0) {
      mean[n] = m;
      rstd[n] = r;
    }
  }
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

// Fused backward for half-precision rows of up to kPacks * 32 packs (C <= 1024 in bf16/fp16): one pass over the rows
// instead of the two kernels above (which read inp and dout twice from memory). Block = kRowsPerBlock warps over
// one chunk of rows (the same chunks as the partials kernel); a warp takes a row at a time, its lanes always the
// same columns, so each lane sums norm * dout and dout for its columns in registers. The second half of a row
// re-reads inp and dout, which the first half has just brought into L1: keeping them in registers instead
// would cost 64 registers a thread at C = 1024 and halve the blocks an SM holds. The warps then add their
// sums into shared memory one warp after another (fixed order), and the block writes part_w/part_b[chunk, C] for
// finish_column_sums: bit-reproducible, as before.
template <int kVec, int kPacks, typename T>
__global__ void __launch_bounds__(kRowBlock, 2)
    layernorm_backward_fused_kernel(T* dinp, float* part_w, float* part_b, const T* dout, const T* inp,
                                    const T* weight, const float* mean, const float* rstd, int64_t N, int C,
                                    int64_t rows_per_chunk) {
  float* sh_w = reinterpret_cast<float*>(dynamic_smem());
  float* sh_b = sh_w + C;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_chunk;
  const int64_t r1 = min(N, r0 + rows_per_chunk);
  float acc_w[kPacks][kVec] = {}, acc_b[kPacks][kVec] = {};
  for (int64_t n = r0 + warp; n < r1; n += kRowsPerBlock) {
    const float m = mean[n], r = rstd[n];
    float sum_dn = 0, sum_dn_norm = 0;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int c = (p * kWarpSize + lane) * kVec;
      if (c >= C) continue;
      float xv[kVec], dv[kVec], wt[kVec];
      load<kVec>(inp + n * C + c, xv);
      load<kVec>(dout + n * C + c, dv);
      load<kVec>(weight + c, wt);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float norm = (xv[k] - m) * r;
        acc_w[p][k] += norm * dv[k];
        acc_b[p][k] += dv[k];
        const float dn = dv[k] * wt[k];
        sum_dn += dn;
        sum_dn_norm += dn * norm;
      }
    }
    const float mean_dn = warp_reduce(sum_dn, Add()) / C;
    const float mean_dn_norm = warp_reduce(sum_dn_norm, Add()) / C;
#pragma unroll
    for (int p = 0; p < kPacks; ++p) {
      const int c = (p * kWarpSize + lane) * kVec;
      if (c >= C) continue;
      float xv[kVec], dv[kVec], wt[kVec], g[kVec];
      load<kVec>(inp + n * C + c, xv);
      load<kVec>(dout + n * C + c, dv);
      load<kVec>(weight + c, wt);
      load<kVec>(dinp + n * C + c, g);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float norm = (xv[k] - m) * r;
        g[k] += (dv[k] * wt[k] - mean_dn - norm * mean_dn_norm) * r;
      }
      store<kVec>(dinp + n * C + c, g);
    }
  }
  for (int w = 0; w < kRowsPerBlock; ++w) {
    if (warp == w) {
#pragma unroll
      for (int p = 0; p < kPacks; ++p) {
        const int c = (p * kWarpSize + lane) * kVec;
        if (c >= C) continue;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          sh_w[c + k] = w == 0 ? acc_w[p][k] : sh_w[c + k] + acc_w[p][k];
          sh_b[c + k] = w == 0 ? acc_b[p][k] : sh_b[c + k] + acc_b[p][k];
        }
      }
    }
    __syncthreads();
  }
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    part_w[static_cast<int64_t>(blockIdx.x) * C + c] = sh_w[c];
    part_b[static_cast<int64_t>(blockIdx.x) * C + c] = sh_b[c];
  }
}

template <typename T>
void finish_layernorm_backward(T* dweight, T* dbias, const float* part_w, const float* part_b, int64_t chunks, int C,
                               cudaStream_t stream) {
  finish_column_sums(dweight, part_w, chunks, C, stream);
  finish_column_sums(dbias, part_b, chunks, C, stream);
}

}  // namespace

size_t layernorm_backward_scratch_bytes(int64_t N, int C) {
  return N <= 0 || C <= 0 ? 0 : 2 * static_cast<size_t>(num_chunks(N)) * C * sizeof(float);
}

template <typename T>
void layernorm_forward(T* out, float* mean, float* rstd, const T* inp, const T* weight, const T* bias, int64_t N, int C,
                       const GpuContext& ctx) {
  if (N == 0 || C == 0) return;
  constexpr int kVec = 16 / sizeof(T);
  const unsigned grid = grid_for(N, kRowsPerBlock);
  // With C a multiple of kVec, aligned base pointers give aligned rows.
  launch_packed<T>(C % kVec == 0 && all_aligned(16, out, inp, weight, bias), [&](auto w) {
    layernorm_forward_kernel<decltype(w)::value>
        <<<grid, kRowBlock, 0, ctx.stream>>>(out, mean, rstd, inp, weight, bias, N, C);
  });
}

template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const float* mean,
                        const float* rstd, int64_t N, int C, const GpuContext& ctx) {
  if (N == 0 || C == 0) return;
  const size_t need = layernorm_backward_scratch_bytes(N, C);
  ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= need, "layernorm_backward needs ", need,
           " bytes of scratch, ctx has ", ctx.scratch_bytes);
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = C % kVec == 0 && all_aligned(16, dinp, dout, inp, weight);

  const int64_t chunks = num_chunks(N);
  float* part_w = static_cast<float*>(ctx.scratch);
  float* part_b = part_w + chunks * C;
  const int packs = (C / kVec + kWarpSize - 1) / kWarpSize;  // per lane, when vec
  if constexpr (!std::is_same_v<T, float>) {
    if (vec && packs <= kMaxFusedPacks) {
      const size_t smem = 2 * static_cast<size_t>(C) * sizeof(float);
      auto launch = [&](auto packs_c) {
        layernorm_backward_fused_kernel<kVec, decltype(packs_c)::value><<<static_cast<unsigned>(chunks), kRowBlock,
                                                                          smem, ctx.stream>>>(
            dinp, part_w, part_b, dout, inp, weight, mean, rstd, N, C, chunk_rows(N));
      };
      switch (packs) {
        case 1: launch(Width<1>()); break;
        case 2: launch(Width<2>()); break;
        case 3: launch(Width<3>()); break;
        default: launch(Width<4>()); break;
      }
      ST_CUDA_CHECK_LAUNCH();
      finish_layernorm_backward(dweight, dbias, part_w, part_b, chunks, C, ctx.stream);
      return;
    }
  }
  const unsigned grid = grid_for(N, kRowsPerBlock);
  launch_packed<T>(vec, [&](auto w) {
    layernorm_backward_dinp_kernel<decltype(w)::value>
        <<<grid, kRowBlock, 0, ctx.stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
  });
  const dim3 block(kWarpSize, kRowLanes);
  launch_packed<T>(vec, [&](auto w) {
    constexpr int W = decltype(w)::value;
    const dim3 tiles((C / W + kWarpSize - 1) / kWarpSize, static_cast<unsigned>(chunks));
    layernorm_backward_partials_kernel<W>
        <<<tiles, block, 0, ctx.stream>>>(part_w, part_b, dout, inp, mean, rstd, N, C, chunk_rows(N));
  });
  finish_layernorm_backward(dweight, dbias, part_w, part_b, chunks, C, ctx.stream);
}

template void layernorm_forward<float>(float*, float*, float*, const float*, const float*, const float*, int64_t, int,
                                       const GpuContext&);
template void layernorm_forward<bf16>(bf16*, float*, float*, const bf16*, const bf16*, const bf16*, int64_t, int,
                                      const GpuContext&);
template void layernorm_forward<fp16>(fp16*, float*, float*, const fp16*, const fp16*, const fp16*, int64_t, int,
                                      const GpuContext&);
template void layernorm_backward<float>(float*, float*, float*, const float*, const float*, const float*, const float*,
                                        const float*, int64_t, int, const GpuContext&);
template void layernorm_backward<bf16>(bf16*, bf16*, bf16*, const bf16*, const bf16*, const bf16*, const float*,
                                       const float*, int64_t, int, const GpuContext&);
template void layernorm_backward<fp16>(fp16*, fp16*, fp16*, const fp16*, const fp16*, const fp16*, const float*,
                                       const float*, int64_t, int, const GpuContext&);

}  // namespace st::gpu
