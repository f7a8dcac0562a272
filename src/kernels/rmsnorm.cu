#include "shardtrain/kernels/gpu/rmsnorm.h"

#include <cuda_fp8.h>

#include <algorithm>

#include "fp8_ahead.cuh"
#include "fp8_blocks.cuh"
#include "gpu_pack.cuh"
#include "shardtrain/kernels/gpu/column_sums.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

// Forward and dinp: one warp per row, kRowsPerBlock rows per block, a grid-stride loop over the rows.
constexpr int kRowsPerBlock = 8;
constexpr int kRowBlock = kRowsPerBlock * kWarpSize;

// dweight is summed per chunk of rows into part[chunk, C], then over chunks in order (finish_column_sums). Chunks
// are a function of N alone (never of the device), so the summation tree, and with it every bit of the result, is
// the same on every run and every GPU. About 512 chunks, as layernorm_backward's (rmsnorm_backward_chunks,
// scratch_sizes.h).
constexpr int kPartialsBlock = 256;

int64_t chunk_rows(int64_t N) { return rmsnorm_backward_chunk_rows(N); }
int64_t num_chunks(int64_t N) { return rmsnorm_backward_chunks(N); }

// Calls f(n, lane) for each row n of this warp's: rows blockIdx.x * kRowsPerBlock + warp, then every
// gridDim.x * kRowsPerBlock rows on. The loop is uniform over a warp, so f may reduce across its 32 lanes.
template <typename F>
__device__ __forceinline__ void for_each_warp_row(int64_t N, F&& f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize; n < N; n += stride)
    f(n, static_cast<int>(threadIdx.x % kWarpSize));
}

// rstd = 1 / sqrt(mean(x^2) + eps) of row x, the sum of squares in fp32 over a warp (every lane calls it, every lane
// gets it): the one definition of every kernel below that normalises, so that they take the same bits.
template <int kVec, typename T>
__device__ __forceinline__ float row_rstd(const T* x, int C, int lane, float eps) {
  float ss = 0;
  for_each_pack<kVec>(C, lane, kWarpSize, [&](int64_t c, auto w) {
    constexpr int W = decltype(w)::value;
    float v[W];
    load<W>(x + c, v);
    for (int k = 0; k < W; ++k) ss += v[k] * v[k];
  });
  return 1.0f / sqrtf(warp_reduce(ss, Add()) / C + eps);
}

// out = inp * rstd * weight: rstd first (row_rstd), then a second pass over the row (from L1) for the output, whose
// maximum folds into amax (MaximumFold) when not null.
template <int kVec, typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight, float eps, int64_t N, int C,
                                       unsigned* amax) {
  MaximumFold fold{amax};
  for_each_warp_row(N, [&](int64_t n, int lane) {
    const T* x = inp + n * C;
    const float r = row_rstd<kVec>(x, C, lane, eps);
    for_each_pack<kVec>(C, lane, kWarpSize, [&](int64_t c, auto w) {
      constexpr int W = decltype(w)::value;
      float v[W], wt[W];
      load<W>(x + c, v);
      load<W>(weight + c, wt);
      for (int k = 0; k < W; ++k) v[k] = v[k] * r * wt[k];
      fold.store<W>(out + n * C + c, v);
    });
    if (lane == 0) rstd[n] = r;
  });
  fold.finish();
}

// rmsnorm_forward_fp8: an element of out as rmsnorm_forward<T> stores it, which code_ahead (fp8_ahead.cuh) then casts.
template <typename T>
__device__ __forceinline__ float stored_out(float x, float r, float w) {
  return to_f32(from_f32<T>(x * r * w));
}

// rmsnorm_forward_fp8 where rows and columns are multiples of 8: a block per kFp8NormRows rows, its warps first taking
// their rows' rstd (row_rstd, the packs rmsnorm_forward_kernel reads), then fp8_blocks.cuh's 8 x 8 blocks of those
// rows (read again, from L2): a warp's 4 row groups x 8 lanes along the rows cover kFp8NormCols columns, the block's
// warps side by side.
constexpr int kFp8NormRows = 32, kFp8NormCols = 64;

template <typename T>
__global__ void __launch_bounds__(kRowBlock)
    rmsnorm_fp8_blocks_kernel(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, float* rstd, const T* inp,
                              const T* weight, float eps, int64_t N, int C, float fp8_max,
                              __nv_fp8_interpretation_t format, const unsigned* amax) {
  constexpr int kVec = 16 / sizeof(T);
  __shared__ float block_rstd[kFp8NormRows];
  const float scale = scale_ahead(*amax, fp8_max);
  if (blockIdx.x == 0 && threadIdx.x == 0) *inverse_scale = __fdiv_rn(1.0f, scale);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kFp8NormRows;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  for (int i = warp; i < kFp8NormRows && r0 + i < N; i += kRowsPerBlock) {
    const float r = row_rstd<kVec>(inp + (r0 + i) * C, C, lane, eps);
    if (lane == 0) {
      block_rstd[i] = r;
      rstd[r0 + i] = r;
    }
  }
  __syncthreads();
  MaximumFold fold{own};
  const int group = lane / 8;
  const int64_t r = r0 + 8 * group;
  if (r < N) {
    float rr[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) rr[i] = block_rstd[8 * group + i];
    for (int64_t c = int64_t{warp} * kFp8NormCols + (lane % 8) * 8; c < C; c += int64_t{kRowsPerBlock} * kFp8NormCols) {
      Rows8<T> in;
      in.load(inp + r * C + c, C);
      float wt[8];
      load<8>(weight + c, wt);
      Bytes8 rows[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float v[8];
        in.floats(i, v);
        uint8_t codes[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          const float o = stored_out<T>(v[k], rr[i], wt[k]);
          fold.add(o);
          codes[k] = code_ahead(o, scale, format);
        }
        rows[i] = pack_codes(codes);
        if (q != nullptr) store_row_8(rows[i], q + (r + i) * C + c);
      }
      if (q_t != nullptr) store_transposed_8x8(rows, q_t + c * N + r, N);
    }
  }
  fold.finish();
}

// Any shape: a warp a row, an element a lane at a time, the codes stored one byte at a time.
template <int kVec, typename T>
__global__ void rmsnorm_fp8_kernel(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, float* rstd,
                                   const T* inp, const T* weight, float eps, int64_t N, int C, float fp8_max,
                                   __nv_fp8_interpretation_t format, const unsigned* amax) {
  const float scale = scale_ahead(*amax, fp8_max);
  if (blockIdx.x == 0 && threadIdx.x == 0) *inverse_scale = __fdiv_rn(1.0f, scale);
  MaximumFold fold{own};
  for_each_warp_row(N, [&](int64_t n, int lane) {
    const float r = row_rstd<kVec>(inp + n * C, C, lane, eps);
    for (int c = lane; c < C; c += kWarpSize) {
      const float o = stored_out<T>(to_f32(inp[n * C + c]), r, to_f32(weight[c]));
      fold.add(o);
      const uint8_t code = code_ahead(o, scale, format);
      if (q != nullptr) q[n * C + c] = code;
      if (q_t != nullptr) q_t[int64_t{c} * N + n] = code;
    }
    if (lane == 0) rstd[n] = r;
  });
  fold.finish();
}

// dinp += rstd * (dn - norm * mean(dn * norm)), norm = inp * rstd, dn = weight * dout, as the reference.
template <int kVec, typename T>
__global__ void rmsnorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight, const float* rstd,
                                             int64_t N, int C, unsigned* amax) {
  MaximumFold fold{amax};
  for_each_warp_row(N, [&](int64_t n, int lane) {
    const int64_t row = n * C;
    const float r = rstd[n];
    float sum_dn_norm = 0;
    for_each_pack<kVec>(C, lane, kWarpSize, [&](int64_t c, auto w) {
      constexpr int W = decltype(w)::value;
      float xv[W], dv[W], wt[W];
      load<W>(inp + row + c, xv);
      load<W>(dout + row + c, dv);
      load<W>(weight + c, wt);
      for (int k = 0; k < W; ++k) sum_dn_norm += (wt[k] * dv[k]) * (xv[k] * r);
    });
    const float mean_dn_norm = warp_reduce(sum_dn_norm, Add()) / C;
    for_each_pack<kVec>(C, lane, kWarpSize, [&](int64_t c, auto w) {
      constexpr int W = decltype(w)::value;
      float xv[W], dv[W], wt[W], g[W];
      load<W>(inp + row + c, xv);
      load<W>(dout + row + c, dv);
      load<W>(weight + c, wt);
      load<W>(dinp + row + c, g);
      for (int k = 0; k < W; ++k) g[k] += (wt[k] * dv[k] - xv[k] * r * mean_dn_norm) * r;
      fold.store<W>(dinp + row + c, g);
    });
  });
  fold.finish();
}

// part[chunk, c] = sum over the chunk's rows n, in order, of (inp[n, c] * rstd[n]) * dout[n, c]: one thread per
// chunk and pack of kVec columns (kVec divides C), a grid-stride loop over them. Threads next to each other take
// packs next to each other in one chunk, so each row's loads are coalesced.
template <int kVec, typename T>
__global__ void rmsnorm_backward_partials_kernel(float* part, const T* dout, const T* inp, const float* rstd, int64_t N,
                                                 int C, int64_t rows_per_chunk, int64_t chunks) {
  const int64_t packs = C / kVec;
  for (int64_t i = thread_index(); i < chunks * packs; i += thread_count()) {
    const int64_t chunk = i / packs;
    const int64_t c = (i - chunk * packs) * kVec;
    const int64_t r1 = min(N, (chunk + 1) * rows_per_chunk);
    float acc[kVec] = {};
    for (int64_t n = chunk * rows_per_chunk; n < r1; ++n) {
      float xv[kVec], dv[kVec];
      load<kVec>(inp + n * C + c, xv);
      load<kVec>(dout + n * C + c, dv);
      const float r = rstd[n];
      for (int k = 0; k < kVec; ++k) acc[k] += (xv[k] * r) * dv[k];
    }
    float* p = part + chunk * C + c;
    for (int k = 0; k < kVec; ++k) p[k] = acc[k];
  }
}

}  // namespace

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, float eps, int64_t N, int C,
                     const GpuContext& ctx, unsigned* amax) {
  if (N == 0 || C == 0) return;
  constexpr int kVec = 16 / sizeof(T);
  // With C a multiple of kVec, aligned base pointers give aligned rows.
  const bool vec = C % kVec == 0 && all_aligned(16, out, inp, weight);
  launch_packed<T>(vec, [&](auto w) {
    rmsnorm_forward_kernel<decltype(w)::value>
        <<<grid_for(N, kRowsPerBlock), kRowBlock, 0, ctx.stream>>>(out, rstd, inp, weight, eps, N, C, amax);
  });
}

template <typename T>
void rmsnorm_forward_fp8(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, float* rstd, const T* inp,
                         const T* weight, float eps, int64_t N, int C, Fp8Format f, const unsigned* amax,
                         const GpuContext& ctx) {
  ST_CHECK(N >= 0 && C >= 0, "gpu::rmsnorm_forward_fp8: ", N, " x ", C);
  const auto format = f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  constexpr int kVec = 16 / sizeof(T);
  // rstd's packs as rmsnorm_forward reads them (kVec a load where every row is aligned), so that both take its bits.
  const bool vec = C % kVec == 0 && all_aligned(16, inp, weight);
  if (N > 0 && C > 0 && N % 8 == 0 && C % 8 == 0 && vec && all_aligned(8 * sizeof(T), inp, weight) &&
      all_aligned(8, q, q_t)) {
    rmsnorm_fp8_blocks_kernel<T><<<grid_for(N, kFp8NormRows), kRowBlock, 0, ctx.stream>>>(
        q, q_t, inverse_scale, own, rstd, inp, weight, eps, N, C, fp8_max(f), format, amax);
    ST_CUDA_CHECK_LAUNCH();
    return;
  }
  // Any shape, and N or C 0: the inverse scale alone (no rows, as rmsnorm_forward writes none).
  const int64_t rows = C == 0 ? 0 : N;
  launch_packed<T>(vec, [&](auto w) {
    rmsnorm_fp8_kernel<decltype(w)::value, T>
        <<<grid_for(std::max<int64_t>(rows, 1), kRowsPerBlock), kRowBlock, 0, ctx.stream>>>(
            q, q_t, inverse_scale, own, rstd, inp, weight, eps, rows, C, fp8_max(f), format, amax);
  });
}

template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const float* rstd, int64_t N,
                      int C, const GpuContext& ctx, GradWrite param_write, unsigned* amax) {
  if (N == 0 || C == 0) return;
  ColumnSums* const deferred = ctx.column_sums;
  const size_t need = rmsnorm_backward_scratch_bytes(N, C);
  ST_CHECK(dweight == nullptr || deferred != nullptr || (ctx.scratch != nullptr && ctx.scratch_bytes >= need),
           "rmsnorm_backward needs ", need, " bytes of scratch, ctx has ", ctx.scratch_bytes);
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = C % kVec == 0 && all_aligned(16, dinp, dout, inp, weight);
  launch_packed<T>(vec, [&](auto w) {
    rmsnorm_backward_dinp_kernel<decltype(w)::value>
        <<<grid_for(N, kRowsPerBlock), kRowBlock, 0, ctx.stream>>>(dinp, dout, inp, weight, rstd, N, C, amax);
  });
  if (dweight == nullptr) return;  // a frozen weight: dinp's kernel is the same either way

  const int64_t chunks = num_chunks(N);
  float* part = deferred ? deferred->reserve(chunks * C) : static_cast<float*>(ctx.scratch);
  launch_packed<T>(vec, [&](auto w) {
    constexpr int W = decltype(w)::value;
    rmsnorm_backward_partials_kernel<W><<<grid_for(chunks * (C / W), kPartialsBlock), kPartialsBlock, 0, ctx.stream>>>(
        part, dout, inp, rstd, N, C, chunk_rows(N), chunks);
  });
  if (deferred)
    deferred->queue(dweight, part, chunks, C, param_write);
  else
    finish_column_sums(dweight, part, chunks, C, ctx.stream, param_write);
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, float, int64_t, int, const GpuContext&,
                                     unsigned*);
template void rmsnorm_forward<bf16>(bf16*, float*, const bf16*, const bf16*, float, int64_t, int, const GpuContext&,
                                    unsigned*);
template void rmsnorm_forward<fp16>(fp16*, float*, const fp16*, const fp16*, float, int64_t, int, const GpuContext&,
                                    unsigned*);
template void rmsnorm_forward_fp8<float>(uint8_t*, uint8_t*, float*, unsigned*, float*, const float*, const float*,
                                         float, int64_t, int, Fp8Format, const unsigned*, const GpuContext&);
template void rmsnorm_forward_fp8<bf16>(uint8_t*, uint8_t*, float*, unsigned*, float*, const bf16*, const bf16*, float,
                                        int64_t, int, Fp8Format, const unsigned*, const GpuContext&);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int64_t,
                                      int, const GpuContext&, GradWrite, unsigned*);
template void rmsnorm_backward<bf16>(bf16*, bf16*, const bf16*, const bf16*, const bf16*, const float*, int64_t, int,
                                     const GpuContext&, GradWrite, unsigned*);
template void rmsnorm_backward<fp16>(fp16*, fp16*, const fp16*, const fp16*, const fp16*, const float*, int64_t, int,
                                     const GpuContext&, GradWrite, unsigned*);

}  // namespace st::gpu
