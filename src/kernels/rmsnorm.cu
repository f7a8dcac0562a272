#include "shardtrain/kernels/gpu/rmsnorm.h"

#include <algorithm>

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
// the same on every run and every GPU. About kTargetChunks chunks, as layernorm_backward's: enough blocks to fill
// an H200, while the partials (chunks * C floats) stay small beside the rows.
constexpr int64_t kTargetChunks = 512;
constexpr int64_t kMinChunkRows = 8;

int64_t chunk_rows(int64_t N) { return std::max(kMinChunkRows, (N + kTargetChunks - 1) / kTargetChunks); }
int64_t num_chunks(int64_t N) { return (N + chunk_rows(N) - 1) / chunk_rows(N); }

// The dweight partials: a block covers kWarpSize packs of columns and one chunk of rows, with kRowLanes threads down
// the rows.
constexpr int kRowLanes = 8;

template <int kVec, typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* weight, float eps, int64_t N,
                                       int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  // The row loop is uniform over a warp, so the shuffles below see all 32 lanes.
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize; n < N; n += nwarps) {
    const T* x = inp + n * C;
    float ss = 0;
    for_each_pack<kVec>(C, lane, kWarpSize, [&](int64_t c, auto w) {
      constexpr int W = decltype(w)::value;
      float v[W];
      load<W>(x + c, v);
      for (int k = 0; k < W; ++k) ss += v[k] * v[k];
    });
    const float r = 1.0f / sqrtf(warp_reduce(ss, Add()) / C + eps);
    // The second read of the row hits L1.
    for_each_pack<kVec>(C, lane, kWarpSize, [&](int64_t c, auto w) {
      constexpr int W = decltype(w)::value;
      float v[W], wt[W];
      load<W>(x + c, v);
      load<W>(weight + c, wt);
      for (int k = 0; k < W; ++k) v[k] = v[k] * r * wt[k];
      store<W>(out + n * C + c, v);
    });
    if (lane == 0) rstd[n] = r;
  }
}

// dinp += rstd * (dn - norm * mean(dn * norm)), norm = inp * rstd, dn = weight * dout: one warp per row.
template <int kVec, typename T>
__global__ void rmsnorm_backward_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* weight, const float* rstd,
                                             int64_t N, int C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t n = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarpSize; n < N; n += nwarps) {
    const T* x = inp + n * C;
    const T* d = dout + n * C;
    const float r = rstd[n];
    float sum_dn_norm = 0;
    for_each_pack<kVec>(C, lane, kWarpSize, [&](int64_t c, auto w) {
      constexpr int W = decltype(w)::value;
      float xv[W], dv[W], wt[W];
      load<W>(x + c, xv);
      load<W>(d + c, dv);
      load<W>(weight + c, wt);
      for (int k = 0; k < W; ++k) sum_dn_norm += (wt[k] * dv[k]) * (xv[k] * r);
    });
    const float mean_dn_norm = warp_reduce(sum_dn_norm, Add()) / C;
    for_each_pack<kVec>(C, lane, kWarpSize, [&](int64_t c, auto w) {
      constexpr int W = decltype(w)::value;
      float xv[W], dv[W], wt[W], g[W];
      load<W>(x + c, xv);
      load<W>(d + c, dv);
      load<W>(weight + c, wt);
      load<W>(dinp + n * C + c, g);
      for (int k = 0; k < W; ++k) g[k] += (wt[k] * dv[k] - xv[k] * r * mean_dn_norm) * r;
      store<W>(dinp + n * C + c, g);
    });
  }
}

// Block (kWarpSize, kRowLanes), grid (column tiles, chunks): the partial sums of (inp * rstd) * dout over one chunk
// of rows, for kWarpSize * kVec columns, written to part[chunk, C]. kVec divides C. Lane y of a column adds rows
// y, y + kRowLanes, ... of the chunk in order, then lane 0 adds the lanes' sums in order: a fixed tree.
template <int kVec, typename T>
__global__ void rmsnorm_backward_partials_kernel(float* part, const T* dout, const T* inp, const float* rstd, int64_t N,
                                                 int C, int64_t rows_per_chunk) {
  __shared__ float sh[kRowLanes][kWarpSize * kVec];
  const int c = (blockIdx.x * kWarpSize + threadIdx.x) * kVec;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(N, r0 + rows_per_chunk);
  float acc[kVec] = {};
  if (c < C) {
    for (int64_t n = r0 + threadIdx.y; n < r1; n += kRowLanes) {
      float xv[kVec], dv[kVec];
      load<kVec>(inp + n * C + c, xv);
      load<kVec>(dout + n * C + c, dv);
      const float r = rstd[n];
      for (int k = 0; k < kVec; ++k) acc[k] += (xv[k] * r) * dv[k];
    }
  }
  for (int k = 0; k < kVec; ++k) sh[threadIdx.y][threadIdx.x * kVec + k] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  for (int k = 0; k < kVec; ++k) {
    float s = 0;
    for (int y = 0; y < kRowLanes; ++y) s += sh[y][threadIdx.x * kVec + k];
    part[static_cast<int64_t>(blockIdx.y) * C + c + k] = s;
  }
}

}  // namespace

size_t rmsnorm_backward_scratch_bytes(int64_t N, int C) {
  return N <= 0 || C <= 0 ? 0 : static_cast<size_t>(num_chunks(N)) * C * sizeof(float);
}

template <typename T>
void rmsnorm_forward(T* out, float* rstd, const T* inp, const T* weight, float eps, int64_t N, int C,
                     const GpuContext& ctx) {
  if (N == 0 || C == 0) return;
  constexpr int kVec = 16 / sizeof(T);
  // With C a multiple of kVec, aligned base pointers give aligned rows.
  const bool vec = C % kVec == 0 && all_aligned(16, out, inp, weight);
  launch_packed<T>(vec, [&](auto w) {
    rmsnorm_forward_kernel<decltype(w)::value>
        <<<grid_for(N, kRowsPerBlock), kRowBlock, 0, ctx.stream>>>(out, rstd, inp, weight, eps, N, C);
  });
}

template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, const float* rstd, int64_t N,
                      int C, const GpuContext& ctx, GradWrite param_write) {
  if (N == 0 || C == 0) return;
  ColumnSums* const deferred = ctx.column_sums;
  const size_t need = rmsnorm_backward_scratch_bytes(N, C);
  ST_CHECK(deferred != nullptr || (ctx.scratch != nullptr && ctx.scratch_bytes >= need), "rmsnorm_backward needs ",
           need, " bytes of scratch, ctx has ", ctx.scratch_bytes);
  constexpr int kVec = 16 / sizeof(T);
  const bool vec = C % kVec == 0 && all_aligned(16, dinp, dout, inp, weight);
  launch_packed<T>(vec, [&](auto w) {
    rmsnorm_backward_dinp_kernel<decltype(w)::value>
        <<<grid_for(N, kRowsPerBlock), kRowBlock, 0, ctx.stream>>>(dinp, dout, inp, weight, rstd, N, C);
  });

  const int64_t chunks = num_chunks(N);
  float* part = deferred ? deferred->reserve(chunks * C) : static_cast<float*>(ctx.scratch);
  launch_packed<T>(vec, [&](auto w) {
    constexpr int W = decltype(w)::value;
    const dim3 tiles((C / W + kWarpSize - 1) / kWarpSize, static_cast<unsigned>(chunks));
    rmsnorm_backward_partials_kernel<W>
        <<<tiles, dim3(kWarpSize, kRowLanes), 0, ctx.stream>>>(part, dout, inp, rstd, N, C, chunk_rows(N));
  });
  if (deferred)
    deferred->queue(dweight, part, chunks, C, param_write);
  else
    finish_column_sums(dweight, part, chunks, C, ctx.stream, param_write);
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, float, int64_t, int,
                                     const GpuContext&);
template void rmsnorm_forward<bf16>(bf16*, float*, const bf16*, const bf16*, float, int64_t, int, const GpuContext&);
template void rmsnorm_forward<fp16>(fp16*, float*, const fp16*, const fp16*, float, int64_t, int, const GpuContext&);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*, const float*, int64_t,
                                      int, const GpuContext&, GradWrite);
template void rmsnorm_backward<bf16>(bf16*, bf16*, const bf16*, const bf16*, const bf16*, const float*, int64_t, int,
                                     const GpuContext&, GradWrite);
template void rmsnorm_backward<fp16>(fp16*, fp16*, const fp16*, const fp16*, const fp16*, const float*, int64_t, int,
                                     const GpuContext&, GradWrite);

}  // namespace st::gpu
