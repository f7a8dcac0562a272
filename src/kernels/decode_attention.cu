#include "shardtrain/kernels/gpu/decode_attention.h"

#include <algorithm>
#include <cmath>

#include "gpu_pack.cuh"
#include "shardtrain/core/error.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kDimsPerThread = kDecodeAttentionMaxHeadSize / kThreads;
static_assert(kDecodeAttentionTile <= kThreads, "a tile's probabilities are one per thread");

// Block b is query b / NH, head b % NH. Per tile of keys: each warp scores keys tile_start + warp, + kWarps, ... (its
// lanes split the head's dimensions, then a butterfly sum); every thread finds the tile's max (reading the scores in
// order, so all agree), rescales its running sum and accumulator by exp(old max - new max), and adds the tile's
// probabilities times the values of the dimensions it owns (d = threadIdx.x + k * kThreads).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    decode_attention_kernel(T* out, const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, int pos, int NH,
                            int group, int hs, int64_t kv_stride, float scale, const int32_t* positions,
                            int64_t seq_stride) {
  __shared__ float qs[kDecodeAttentionMaxHeadSize];
  __shared__ float p[kDecodeAttentionTile];
  const int i = static_cast<int>(blockIdx.x / NH), h = static_cast<int>(blockIdx.x % NH);
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  // keys 0 .. pos + i, or with positions 0 .. positions[i] of row i's own cache
  const int len = positions != nullptr ? positions[i] + 1 : pos + i + 1;
  if (positions != nullptr) {
    k_cache += i * seq_stride;
    v_cache += i * seq_stride;
  }
  const T* qh = q + i * q_stride + static_cast<int64_t>(h) * hs;
  const int64_t kv_off = static_cast<int64_t>(h / group) * hs;
  for (int d = tid; d < hs; d += kThreads) qs[d] = to_f32(qh[d]);
  __syncthreads();

  float m = -INFINITY, l = 0.0f;
  float acc[kDimsPerThread];
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) acc[k] = 0.0f;
  for (int j0 = 0; j0 < len; j0 += kDecodeAttentionTile) {
    const int count = min(kDecodeAttentionTile, len - j0);
    for (int jj = warp; jj < count; jj += kWarps) {
      const T* k = k_cache + (j0 + jj) * kv_stride + kv_off;
      float dot = 0.0f;
      for (int d = lane; d < hs; d += kWarpSize) dot += qs[d] * to_f32(k[d]);
      dot = warp_reduce(dot, Add());
      if (lane == 0) p[jj] = dot * scale;
    }
    __syncthreads();
    float tile_max = p[0];
    for (int jj = 1; jj < count; ++jj) tile_max = fmaxf(tile_max, p[jj]);
    const float m_new = fmaxf(m, tile_max);
    const float alpha = expf(m - m_new);  // 0 on the first tile (m = -inf)
    __syncthreads();                      // every thread has read the scores
    if (tid < count) p[tid] = expf(p[tid] - m_new);
    __syncthreads();
    float tile_sum = 0.0f;
    for (int jj = 0; jj < count; ++jj) tile_sum += p[jj];
    l = l * alpha + tile_sum;
#pragma unroll
    for (int k = 0; k < kDimsPerThread; ++k) {
      const int d = tid + k * kThreads;
      if (d >= hs) break;
      float a = acc[k] * alpha;
      const T* v = v_cache + j0 * kv_stride + kv_off + d;
      for (int jj = 0; jj < count; ++jj) a += p[jj] * to_f32(v[jj * kv_stride]);
      acc[k] = a;
    }
    m = m_new;
    __syncthreads();  // the next tile overwrites p
  }
  T* o = out + (static_cast<int64_t>(i) * NH + h) * hs;
#pragma unroll
  for (int k = 0; k < kDimsPerThread; ++k) {
    const int d = tid + k * kThreads;
    if (d < hs) o[d] = from_f32<T>(acc[k] / l);
  }
}

}  // namespace

template <typename T>
void decode_attention(T* out, const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, int n, int pos, int NH,
                      int NKV, int hs, const GpuContext& ctx) {
  ST_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0 && hs > 0, "NH = ", NH, " is not a positive multiple of NKV = ", NKV);
  ST_CHECK(hs <= kDecodeAttentionMaxHeadSize, "decode attention takes head sizes up to ", kDecodeAttentionMaxHeadSize,
           ", got ", hs);
  ST_CHECK(n >= 1 && pos >= 0 && q_stride >= int64_t{NH} * hs, "decode attention of ", n, " queries at position ", pos,
           " with a query row stride of ", q_stride);
  const int64_t blocks = int64_t{n} * NH;
  ST_CHECK(blocks < (int64_t{1} << 31), "decode attention of ", n, " queries x ", NH, " heads");
  decode_attention_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, ctx.stream>>>(
      out, q, q_stride, k_cache, v_cache, pos, NH, NH / NKV, hs, int64_t{NKV} * hs,
      1.0f / std::sqrt(static_cast<float>(hs)), nullptr, 0);
  ST_CUDA_CHECK_LAUNCH();
}

template <typename T>
void decode_attention_at(T* out, const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, int64_t seq_stride,
                         const int32_t* positions, int rows, int NH, int NKV, int hs, const GpuContext& ctx) {
  ST_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0 && hs > 0, "NH = ", NH, " is not a positive multiple of NKV = ", NKV);
  ST_CHECK(hs <= kDecodeAttentionMaxHeadSize, "decode attention takes head sizes up to ", kDecodeAttentionMaxHeadSize,
           ", got ", hs);
  ST_CHECK(rows >= 1 && q_stride >= int64_t{NH} * hs, "decode attention of ", rows, " rows with a query row stride of ",
           q_stride);
  const int64_t blocks = int64_t{rows} * NH;
  ST_CHECK(blocks < (int64_t{1} << 31), "decode attention of ", rows, " rows x ", NH, " heads");
  decode_attention_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, ctx.stream>>>(
      out, q, q_stride, k_cache, v_cache, 0, NH, NH / NKV, hs, int64_t{NKV} * hs,
      1.0f / std::sqrt(static_cast<float>(hs)), positions, seq_stride);
  ST_CUDA_CHECK_LAUNCH();
}

namespace {

// Row r's key and value heads, one thread per element of the kv_width = NKV hs of each.
template <typename T>
__global__ void kv_append_kernel(T* k_cache, T* v_cache, const T* qkv, int64_t seq_stride, const int32_t* positions,
                                 int rows, int64_t q_width, int64_t kv_width) {
  const int64_t total = static_cast<int64_t>(rows) * kv_width;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / kv_width, c = i % kv_width;
    const int64_t at = r * seq_stride + static_cast<int64_t>(positions[r]) * kv_width + c;
    const T* row = qkv + r * (q_width + 2 * kv_width);
    k_cache[at] = row[q_width + c];
    v_cache[at] = row[q_width + kv_width + c];
  }
}

}  // namespace

template <typename T>
void kv_append_at(T* k_cache, T* v_cache, const T* qkv, int64_t seq_stride, const int32_t* positions, int rows, int NH,
                  int NKV, int hs, const GpuContext& ctx) {
  const int64_t kv_width = int64_t{NKV} * hs, total = int64_t{rows} * kv_width;
  if (total == 0) return;
  constexpr int kBlock = 256;
  const int64_t grid = std::min<int64_t>((total + kBlock - 1) / kBlock, 4096);
  kv_append_kernel<T><<<static_cast<unsigned>(grid), kBlock, 0, ctx.stream>>>(
      k_cache, v_cache, qkv, seq_stride, positions, rows, int64_t{NH} * hs, kv_width);
  ST_CUDA_CHECK_LAUNCH();
}

#define ST_DECODE_STEP_INSTANTIATE(T)                                                                                \
  template void decode_attention_at<T>(T*, const T*, int64_t, const T*, const T*, int64_t, const int32_t*, int, int, \
                                       int, int, const GpuContext&);                                                 \
  template void kv_append_at<T>(T*, T*, const T*, int64_t, const int32_t*, int, int, int, int, const GpuContext&);
ST_DECODE_STEP_INSTANTIATE(float)
ST_DECODE_STEP_INSTANTIATE(bf16)
ST_DECODE_STEP_INSTANTIATE(fp16)
#undef ST_DECODE_STEP_INSTANTIATE

template void decode_attention<float>(float*, const float*, int64_t, const float*, const float*, int, int, int, int,
                                      int, const GpuContext&);
template void decode_attention<bf16>(bf16*, const bf16*, int64_t, const bf16*, const bf16*, int, int, int, int, int,
                                     const GpuContext&);
template void decode_attention<fp16>(fp16*, const fp16*, int64_t, const fp16*, const fp16*, int, int, int, int, int,
                                     const GpuContext&);

}  // namespace st::gpu
