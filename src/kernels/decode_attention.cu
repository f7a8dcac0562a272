#include "shardtrain/kernels/gpu/decode_attention.h"

#include <algorithm>
#include <cmath>

#include "gpu_pack.cuh"
#include "rope_turn.cuh"
#include "shardtrain/core/error.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

constexpr int kThreads = 128;
constexpr int kAppendBlock = 256;  // threads of a block of the cache appends
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kDimsPerThread = kDecodeAttentionMaxHeadSize / kThreads;
static_assert(kDecodeAttentionTile <= kThreads, "a tile's probabilities are one per thread");

// Block b is query b / NH, head b % NH. Per tile of keys: each warp scores keys tile_start + warp, + kWarps, ... (its
// lanes split the head's dimensions, then a butterfly sum); every thread finds the tile's max (reading the scores in
// order, so all agree), rescales its running sum and accumulator by exp(old max - new max), and adds the tile's
// probabilities times the values of the dimensions it owns (d = threadIdx.x + k * kThreads).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    decode_attention_kernel(T* out, const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, int NH, int group,
                            int hs, int64_t kv_stride, float scale, const int32_t* positions, int64_t seq_stride) {
  __shared__ float qs[kDecodeAttentionMaxHeadSize];
  __shared__ float p[kDecodeAttentionTile];
  const int i = static_cast<int>(blockIdx.x / NH), h = static_cast<int>(blockIdx.x % NH);
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const int len = positions[i] + 1;  // keys 0 .. positions[i] of row i's own cache
  if (len <= 0) {                    // an idle row (negative position): zeros
    for (int d = tid; d < hs; d += kThreads) out[(static_cast<int64_t>(i) * NH + h) * hs + d] = from_f32<T>(0.0f);
    return;
  }
  k_cache += i * seq_stride;
  v_cache += i * seq_stride;
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

namespace {

// The split-K step (few rows): block (s, h, r) scores keys [s kDecodeSplitKeys, + kDecodeSplitKeys) of row r's cache
// below its length for query head h, and writes its partial softmax: the running max m, the sum l of exp(score - m)
// and acc[d] = the sum of exp(score - m) v[d], at part + ((r NH + h) splits + s) (hs + 2) as acc[0 .. hs), m, l.
// Thread t < count scores key t (its row read in packs of kVec); warp 0 takes the softmax; the values are summed by
// groups of keys (below). Splits past the row's length return.
//
// With `arrivals` (a counter per (row, head), zero at the launch), the (row, head)'s splits count themselves in as
// they finish, and the last one merges them all (merge_splits, as decode_combine_kernel does), then zeroes the
// counter for the next launch: no second kernel. An idle row's first split writes its zeros.

struct Max {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
static_assert(kDecodeSplitKeys <= kThreads, "a split's keys are one per thread");
// The value sums of a split's groups: G hs <= kThreads kVec with fewer packs than threads (kVec <= 8), else hs.
constexpr int kSplitSums = kThreads * 8;
static_assert(kSplitSums >= kDecodeAttentionMaxHeadSize, "one group's sums fit");

// The splits of a row at `position` that hold keys: ceil((position + 1) / kDecodeSplitKeys), 0 for an idle row.
__device__ __forceinline__ int split_count(int position) {
  return max(0, position + kDecodeSplitKeys) / kDecodeSplitKeys;
}

// The block's (row, head): its n partials at base (split s at base + s (hs + 2)) merged in split order into o[0 .. hs):
// o[d] = sum_s exp(m_s - M) acc_s[d] / sum_s exp(m_s - M) l_s, M the largest m_s; zeros for n = 0. The partials are
// read through the L2 (__ldcg): other blocks wrote them, during this kernel where the last split merges.
template <typename T>
__device__ void merge_splits(T* o, const float* base, int n, int hs) {
  float M = -INFINITY;
  for (int s = 0; s < n; ++s) M = fmaxf(M, __ldcg(base + s * (hs + 2) + hs));
  float L = 0.0f;
  for (int s = 0; s < n; ++s) L += expf(__ldcg(base + s * (hs + 2) + hs) - M) * __ldcg(base + s * (hs + 2) + hs + 1);
  for (int d = threadIdx.x; d < hs; d += kThreads) {
    float a = 0.0f;
    for (int s = 0; s < n; ++s) a += expf(__ldcg(base + s * (hs + 2) + hs) - M) * __ldcg(base + s * (hs + 2) + d);
    o[d] = from_f32<T>(n == 0 ? 0.0f : a / L);
  }
}

// RoPE and the cache append folded into the split-K step (rope_append_attend_at): the tables, and the caches to write.
template <typename T>
struct FoldedAppend {
  const float* cos = nullptr;  // null: nothing folded in
  const float* sin = nullptr;
  T* k_cache = nullptr;
  T* v_cache = nullptr;
};

// A float rounded through T, as a kernel that stores it in T and another that reads it back would see it.
template <typename T>
__device__ __forceinline__ float through(float x) {
  return to_f32(from_f32<T>(x));
}

// With `fold` (one row per cache, or one row): the block turns its query head by RoPE at the row's position t itself
// (rope_turn, rounded through T, as rope_kv_append_kernel stores it), and the split that holds t turns the new key
// and takes it and the new value from the qkv row instead of the cache; the first query head of each key/value head
// there also writes them to the caches. No block reads position t from a cache, so the appends race with nothing.
// q's row is left as it came, unturned.
template <int kVec, typename T>
__global__ void __launch_bounds__(kThreads)
    decode_split_kernel(float* part, T* out, unsigned* arrivals, const T* q, int64_t q_stride, const T* k_cache,
                        const T* v_cache, int64_t seq_stride, const int32_t* positions, int NH, int group, int hs,
                        int64_t kv_stride, float scale, int splits, FoldedAppend<T> fold) {
  __shared__ float qs[kDecodeAttentionMaxHeadSize];
  __shared__ float kt[kDecodeAttentionMaxHeadSize];  // fold: the new key, turned and rounded through T
  __shared__ float p[kDecodeSplitKeys];
  __shared__ float sums[kSplitSums];
  __shared__ float stats[2];
  __shared__ bool last;
  allow_dependents();
  wait_for_predecessor();
  const int s = blockIdx.x, h = blockIdx.y, r = blockIdx.z;
  const int len = positions[r] + 1, j0 = s * kDecodeSplitKeys;
  const int head = r * NH + h;
  if (j0 >= len) {
    if (arrivals != nullptr && len <= 0 && s == 0) merge_splits(out + static_cast<int64_t>(head) * hs, part, 0, hs);
    return;
  }
  const int count = min(kDecodeSplitKeys, len - j0);
  const int tid = threadIdx.x, lane = tid % kWarpSize, warp = tid / kWarpSize;
  const T* row = q + r * q_stride;
  const T* qh = row + static_cast<int64_t>(h) * hs;
  const int kv_head = h / group;
  const int64_t kv_off = r * seq_stride + static_cast<int64_t>(kv_head) * hs;
  const int t = len - 1;  // the row's position: its new key's
  const bool folded = fold.cos != nullptr;
  const bool new_key = folded && j0 + count - 1 == t;  // this split holds it
  const T* new_value = row + static_cast<int64_t>(NH) * hs + kv_stride + static_cast<int64_t>(kv_head) * hs;
  if (folded) {
    const int half = hs / 2;
    const float* c = fold.cos + static_cast<int64_t>(t) * half;
    const float* sn = fold.sin + static_cast<int64_t>(t) * half;
    for (int d = tid; d < half; d += kThreads) {
      float a[1], b[1];
      rope_turn<1>(qh + d, half, c + d, sn + d, 1.0f, a, b);
      qs[d] = through<T>(a[0]);
      qs[d + half] = through<T>(b[0]);
    }
    if (new_key) {
      const bool append = h % group == 0;
      const T* key = row + static_cast<int64_t>(NH) * hs + static_cast<int64_t>(kv_head) * hs;
      const int64_t at = kv_off + static_cast<int64_t>(t) * kv_stride;
      for (int d = tid; d < half; d += kThreads) {
        float a[1], b[1];
        rope_turn<1>(key + d, half, c + d, sn + d, 1.0f, a, b);
        const T ka = from_f32<T>(a[0]), kb = from_f32<T>(b[0]);
        kt[d] = to_f32(ka);
        kt[d + half] = to_f32(kb);
        if (append) fold.k_cache[at + d] = ka, fold.k_cache[at + d + half] = kb;
      }
      if (append)
        for (int d = tid; d < hs; d += kThreads) fold.v_cache[at + d] = new_value[d];
    }
  } else {
    for (int d = tid; d < hs; d += kThreads) qs[d] = to_f32(qh[d]);
  }
  __syncthreads();
  if (tid < count) {
    float dot = 0.0f;
    if (new_key && j0 + tid == t) {
      for (int d = 0; d < hs; ++d) dot += qs[d] * kt[d];  // the packed loop's order
    } else {
      const T* k = k_cache + kv_off + (j0 + tid) * kv_stride;
#pragma unroll 4
      for (int d = 0; d < hs; d += kVec) {
        float kv[kVec];
        load<kVec>(k + d, kv);
#pragma unroll
        for (int i = 0; i < kVec; ++i) dot += qs[d + i] * kv[i];
      }
    }
    p[tid] = dot * scale;
  }
  __syncthreads();
  if (warp == 0) {
    float m = -INFINITY;
    for (int j = lane; j < count; j += kWarpSize) m = fmaxf(m, p[j]);
    m = warp_reduce(m, Max());
    float l = 0.0f;
    for (int j = lane; j < count; j += kWarpSize) {
      const float e = expf(p[j] - m);
      p[j] = e;
      l += e;
    }
    l = warp_reduce(l, Add());
    if (lane == 0) stats[0] = m, stats[1] = l;
  }
  __syncthreads();
  // The values: thread t sums pack pk = t % P of the head's P = hs / kVec packs over the keys g, g + G, ... of its
  // group g = t / P (G = kThreads / P groups); with as many packs as threads or more, one group, and each thread takes
  // the packs t, t + kThreads, ... The groups' sums are added in group order.
  const int P = hs / kVec, G = P >= kThreads ? 1 : kThreads / P;
  if (P >= kThreads || tid < G * P) {
    const int g = P >= kThreads ? 0 : tid / P;
    for (int pk = P >= kThreads ? tid : tid % P; pk < P; pk += kThreads) {
      float acc[kVec] = {};
#pragma unroll 4
      for (int j = g; j < count; j += G) {
        float v[kVec];
        const T* value = new_key && j0 + j == t ? new_value : v_cache + kv_off + (j0 + j) * kv_stride;
        load<kVec>(value + pk * kVec, v);
        const float pj = p[j];
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[i] += pj * v[i];
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) sums[g * hs + pk * kVec + i] = acc[i];
    }
  }
  __syncthreads();
  float* const first = part + static_cast<int64_t>(head) * splits * (hs + 2);
  float* const mine = first + static_cast<int64_t>(s) * (hs + 2);
  for (int d = tid; d < hs; d += kThreads) {
    float a = 0.0f;
    for (int w = 0; w < G; ++w) a += sums[w * hs + d];
    mine[d] = a;
  }
  if (tid == 0) mine[hs] = stats[0], mine[hs + 1] = stats[1];
  if (arrivals == nullptr) return;
  __threadfence();  // this block's partial, visible to the split that merges, before it counts in
  __syncthreads();
  // The splits that count in: those of the grid below the row's length.
  const int n = min(split_count(len - 1), splits);
  if (tid == 0) {
    unsigned* const count = arrivals + head;
    last = atomicAdd(count, 1u) == static_cast<unsigned>(n - 1);
    if (last) *count = 0;  // every split has counted in
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  merge_splits(out + static_cast<int64_t>(head) * hs, first, n, hs);
}

// Block (h, r): the partials of row r's splits below its length, merged in split order (merge_splits).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    decode_combine_kernel(T* out, const float* part, const int32_t* positions, int NH, int hs, int splits) {
  allow_dependents();
  wait_for_predecessor();
  const int h = blockIdx.x, r = blockIdx.y;
  const int head = r * NH + h;
  merge_splits(out + static_cast<int64_t>(head) * hs, part + static_cast<int64_t>(head) * splits * (hs + 2),
               min(split_count(positions[r]), splits), hs);
}

// Whether the split kernel reads the caches' keys and values in 16-byte packs.
template <typename T>
bool cache_packs(int hs, const T* k_cache, const T* v_cache) {
  return hs % (16 / sizeof(T)) == 0 && all_aligned(16, k_cache, v_cache);
}

void check_attention(int rows, int NH, int NKV, int hs, int max_len, int64_t q_stride) {
  ST_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0 && hs > 0, "NH = ", NH, " is not a positive multiple of NKV = ", NKV);
  ST_CHECK(hs <= kDecodeAttentionMaxHeadSize, "decode attention takes head sizes up to ", kDecodeAttentionMaxHeadSize,
           ", got ", hs);
  ST_CHECK(rows >= 1 && max_len >= 1 && q_stride >= int64_t{NH} * hs, "decode attention of ", rows,
           " rows with a query row stride of ", q_stride, " and caches of ", max_len, " positions");
}

// The split-K step of at most kDecodeSplitMaxRows rows (decode_split_kernel), merged by a second kernel or, given
// arrivals, in it; with fold.cos, RoPE and the cache append folded in, q's rows 16-byte aligned where the caches are
// read in packs (the new values are read from them alike).
template <typename T>
void split_attention(T* out, const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, int64_t seq_stride,
                     const int32_t* positions, int rows, int NH, int NKV, int hs, int max_len, const GpuContext& ctx,
                     unsigned* arrivals, const FoldedAppend<T>& fold) {
  const size_t need = decode_attention_at_scratch_bytes(rows, NH, hs, max_len);
  ST_CHECK(ctx.scratch != nullptr && ctx.scratch_bytes >= need, "decode attention of ", rows, " rows needs ", need,
           " bytes of scratch, ctx has ", ctx.scratch_bytes);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int splits = (max_len + kDecodeSplitKeys - 1) / kDecodeSplitKeys;
  auto* part = static_cast<float*>(ctx.scratch);
  launch_packed<T>(cache_packs(hs, k_cache, v_cache), [&](auto w) {
    constexpr int W = decltype(w)::value;
    launch_after_predecessor(decode_split_kernel<W, T>, dim3(splits, NH, rows), dim3(kThreads), 0, ctx.stream, part,
                             out, arrivals, q, q_stride, k_cache, v_cache, seq_stride, positions, NH, NH / NKV, hs,
                             int64_t{NKV} * hs, scale, splits, fold);
  });
  if (arrivals == nullptr)
    launch_after_predecessor(decode_combine_kernel<T>, dim3(NH, rows), dim3(kThreads), 0, ctx.stream, out, part,
                             positions, NH, hs, splits);
}

}  // namespace

template <typename T>
void decode_attention_at(T* out, const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, int64_t seq_stride,
                         const int32_t* positions, int rows, int NH, int NKV, int hs, int max_len,
                         const GpuContext& ctx, unsigned* arrivals) {
  check_attention(rows, NH, NKV, hs, max_len, q_stride);
  if (rows <= kDecodeSplitMaxRows)
    return split_attention<T>(out, q, q_stride, k_cache, v_cache, seq_stride, positions, rows, NH, NKV, hs, max_len,
                              ctx, arrivals, {});
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t blocks = int64_t{rows} * NH;
  ST_CHECK(blocks < (int64_t{1} << 31), "decode attention of ", rows, " rows x ", NH, " heads");
  decode_attention_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, ctx.stream>>>(
      out, q, q_stride, k_cache, v_cache, NH, NH / NKV, hs, int64_t{NKV} * hs, scale, positions, seq_stride);
  ST_CUDA_CHECK_LAUNCH();
}

namespace {

// Row r's key and value heads, one thread per element of the kv_width = NKV hs of each.
template <typename T>
__global__ void kv_append_kernel(T* k_cache, T* v_cache, const T* qkv, int64_t seq_stride, const int32_t* positions,
                                 int rows, int64_t q_width, int64_t kv_width) {
  allow_dependents();
  wait_for_predecessor();
  const int64_t total = static_cast<int64_t>(rows) * kv_width;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / kv_width, c = i % kv_width;
    if (positions[r] < 0) continue;  // an idle row
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
  const int64_t grid = std::min<int64_t>((total + kAppendBlock - 1) / kAppendBlock, 4096);
  launch_after_predecessor(kv_append_kernel<T>, dim3(static_cast<unsigned>(grid)), dim3(kAppendBlock), 0, ctx.stream,
                           k_cache, v_cache, qkv, seq_stride, positions, rows, int64_t{NH} * hs, kv_width);
}

namespace {

// Row r's query and key heads turned by RoPE at positions[r], in place, as rope_forward_at's kernel turns them (the
// same products, rounded to T once), the turned key heads into the key cache as they are stored, and the value heads
// into the value cache. Threads run over the [rows, NH + NKV, hs / 2 / kVec] pair packs of the turned heads (a pack:
// kVec pairs (j, j + hs / 2) of one head), then over the [rows, NKV, hs / kVec] packs of the value heads. An idle
// row (negative position) is left alone.
template <int kVec, typename T>
__global__ void rope_kv_append_kernel(T* qkv, T* k_cache, T* v_cache, const float* cos, const float* sin,
                                      int64_t seq_stride, const int32_t* positions, int rows, int NH, int NKV, int hs) {
  allow_dependents();
  wait_for_predecessor();
  const int half = hs / 2, heads = NH + NKV;
  const int64_t kv_width = int64_t{NKV} * hs, width = int64_t{NH + 2 * NKV} * hs;
  const int64_t pair_packs = half / kVec, value_packs = hs / kVec;
  const int64_t turned = int64_t{rows} * heads * pair_packs, total = turned + int64_t{rows} * NKV * value_packs;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    if (i < turned) {
      const int j = static_cast<int>(i % pair_packs) * kVec;
      const int64_t rh = i / pair_packs;
      const int h = static_cast<int>(rh % heads);
      const int64_t r = rh / heads;
      const int64_t t = positions[r];
      if (t < 0) continue;
      T* x = qkv + r * width + int64_t{h} * hs + j;
      float a[kVec], b[kVec];
      rope_turn<kVec>(x, half, cos + t * half + j, sin + t * half + j, 1.0f, a, b);
      store<kVec>(x, a);
      store<kVec>(x + half, b);
      if (h >= NH) {
        T* key = k_cache + r * seq_stride + t * kv_width + int64_t{h - NH} * hs + j;
        store<kVec>(key, a);
        store<kVec>(key + half, b);
      }
    } else {
      const int64_t v = i - turned;
      const int j = static_cast<int>(v % value_packs) * kVec;
      const int64_t rh = v / value_packs;
      const int h = static_cast<int>(rh % NKV);
      const int64_t r = rh / NKV;
      const int64_t t = positions[r];
      if (t < 0) continue;
      float x[kVec];
      load<kVec>(qkv + r * width + int64_t{heads + h} * hs + j, x);
      store<kVec>(v_cache + r * seq_stride + t * kv_width + int64_t{h} * hs + j, x);
    }
  }
}

}  // namespace

template <typename T>
void rope_kv_append_at(T* qkv, T* k_cache, T* v_cache, const float* cos, const float* sin, int64_t seq_stride,
                       const int32_t* positions, int rows, int NH, int NKV, int hs, const GpuContext& ctx) {
  ST_CHECK(hs % 2 == 0, "RoPE needs an even head dimension, got ", hs);
  const int64_t total = int64_t{rows} * (int64_t{NH + NKV} * hs / 2 + int64_t{NKV} * hs);
  if (total == 0) return;
  constexpr int kVec = 16 / sizeof(T);
  // With hs / 2 a multiple of kVec, every head's halves, rows and cache positions start kVec-aligned.
  launch_packed<T>((hs / 2) % kVec == 0 && all_aligned(16, qkv, k_cache, v_cache), [&](auto w) {
    constexpr int W = decltype(w)::value;
    launch_after_predecessor(rope_kv_append_kernel<W, T>, dim3(grid_for(total / W, kAppendBlock)), dim3(kAppendBlock),
                             0, ctx.stream, qkv, k_cache, v_cache, cos, sin, seq_stride, positions, rows, NH, NKV, hs);
  });
}

template <typename T>
void rope_append_attend_at(T* out, T* qkv, T* k_cache, T* v_cache, const float* cos, const float* sin,
                           int64_t seq_stride, const int32_t* positions, int rows, int NH, int NKV, int hs, int max_len,
                           const GpuContext& ctx, unsigned* arrivals) {
  const int64_t width = int64_t{NH + 2 * NKV} * hs;
  check_attention(rows, NH, NKV, hs, max_len, width);
  ST_CHECK(hs % 2 == 0, "RoPE needs an even head dimension, got ", hs);
  // Folded, the split reads the new values from qkv's rows: in packs only where qkv allows them, and the cached keys
  // and values in packs only where the caches do; the fold runs where both agree, so that its sums are the two
  // calls' in the same order.
  if (rows <= kDecodeSplitMaxRows && (seq_stride != 0 || rows == 1) &&
      (!cache_packs(hs, k_cache, v_cache) || all_aligned(16, qkv)))
    return split_attention<T>(out, qkv, width, k_cache, v_cache, seq_stride, positions, rows, NH, NKV, hs, max_len, ctx,
                              arrivals, {cos, sin, k_cache, v_cache});
  rope_kv_append_at<T>(qkv, k_cache, v_cache, cos, sin, seq_stride, positions, rows, NH, NKV, hs, ctx);
  decode_attention_at<T>(out, qkv, width, k_cache, v_cache, seq_stride, positions, rows, NH, NKV, hs, max_len, ctx,
                         arrivals);
}

#define ST_DECODE_STEP_INSTANTIATE(T)                                                                                \
  template void decode_attention_at<T>(T*, const T*, int64_t, const T*, const T*, int64_t, const int32_t*, int, int, \
                                       int, int, int, const GpuContext&, unsigned*);                                 \
  template void kv_append_at<T>(T*, T*, const T*, int64_t, const int32_t*, int, int, int, int, const GpuContext&);   \
  template void rope_kv_append_at<T>(T*, T*, T*, const float*, const float*, int64_t, const int32_t*, int, int, int, \
                                     int, const GpuContext&);                                                        \
  template void rope_append_attend_at<T>(T*, T*, T*, T*, const float*, const float*, int64_t, const int32_t*, int,   \
                                         int, int, int, int, const GpuContext&, unsigned*);
ST_DECODE_STEP_INSTANTIATE(float)
ST_DECODE_STEP_INSTANTIATE(bf16)
ST_DECODE_STEP_INSTANTIATE(fp16)
#undef ST_DECODE_STEP_INSTANTIATE

}  // namespace st::gpu
