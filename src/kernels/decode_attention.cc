#include "shardtrain/kernels/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "parallel.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/rope.h"

namespace st {

using kernels_internal::kMinParallelWork;

// One (query, head) pair at a time: its scores against every visible key, their softmax (max subtracted, sums in
// double), then the probability-weighted sum of the values. The pairs are independent, so they run in parallel.
void decode_attention(float* out, const float* q, int64_t q_stride, const float* k_cache, const float* v_cache, int n,
                      int pos, int NH, int NKV, int hs) {
  ST_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0 && hs > 0, "NH = ", NH, " is not a positive multiple of NKV = ", NKV);
  ST_CHECK(n >= 1 && pos >= 0 && q_stride >= int64_t{NH} * hs, "decode attention of ", n, " queries at position ", pos,
           " with a query row stride of ", q_stride);
  const int group = NH / NKV;
  const int64_t kv_stride = int64_t{NKV} * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  const int64_t pairs = int64_t{n} * NH;
  const int64_t work = pairs * (pos + n) * hs;
#pragma omp parallel if (work >= kMinParallelWork)
  {
    std::vector<double> p(static_cast<size_t>(pos + n));
    std::vector<double> acc(static_cast<size_t>(hs));
#pragma omp for schedule(static)
    for (int64_t r = 0; r < pairs; ++r) {
      const int i = static_cast<int>(r / NH), h = static_cast<int>(r % NH);
      const int len = pos + i + 1;  // keys 0 .. pos + i
      const float* qh = q + i * q_stride + int64_t{h} * hs;
      const int64_t kv_off = int64_t{h / group} * hs;
      double mx = -INFINITY;
      for (int j = 0; j < len; ++j) {
        const float* k = k_cache + j * kv_stride + kv_off;
        float dot = 0;
        for (int d = 0; d < hs; ++d) dot += qh[d] * k[d];
        p[static_cast<size_t>(j)] = static_cast<double>(dot * scale);
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (int j = 0; j < len; ++j) sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx));
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int j = 0; j < len; ++j) {
        const float* v = v_cache + j * kv_stride + kv_off;
        const double pj = p[static_cast<size_t>(j)];
        for (int d = 0; d < hs; ++d) acc[static_cast<size_t>(d)] += pj * v[d];
      }
      float* o = out + (int64_t{i} * NH + h) * hs;
      for (int d = 0; d < hs; ++d) o[d] = static_cast<float>(acc[static_cast<size_t>(d)] / sum);
    }
  }
}

void decode_attention_at(float* out, const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                         int64_t seq_stride, const int32_t* positions, int rows, int NH, int NKV, int hs, int max_len) {
  for (int r = 0; r < rows; ++r)
    ST_CHECK(positions[r] < max_len, "row ", r, " at position ", positions[r], " outside caches of ", max_len);
  for (int r = 0; r < rows; ++r)
    if (positions[r] < 0)
      std::fill(out + int64_t{r} * NH * hs, out + int64_t{r + 1} * NH * hs, 0.0f);
    else
      decode_attention(out + int64_t{r} * NH * hs, q + r * q_stride, q_stride, k_cache + r * seq_stride,
                       v_cache + r * seq_stride, 1, positions[r], NH, NKV, hs);
}

void kv_append_at(float* k_cache, float* v_cache, const float* qkv, int64_t seq_stride, const int32_t* positions,
                  int rows, int NH, int NKV, int hs) {
  const int64_t q_width = int64_t{NH} * hs, kv_width = int64_t{NKV} * hs;
  for (int r = 0; r < rows; ++r) {
    if (positions[r] < 0) continue;
    const float* row = qkv + r * (q_width + 2 * kv_width);
    const int64_t at = r * seq_stride + int64_t{positions[r]} * kv_width;
    std::copy(row + q_width, row + q_width + kv_width, k_cache + at);
    std::copy(row + q_width + kv_width, row + q_width + 2 * kv_width, v_cache + at);
  }
}

void rope_kv_append_at(float* qkv, float* k_cache, float* v_cache, const float* cos, const float* sin,
                       int64_t seq_stride, const int32_t* positions, int rows, int NH, int NKV, int hs) {
  rope_forward_at(qkv, cos, sin, positions, rows, NH, NKV, hs);
  kv_append_at(k_cache, v_cache, qkv, seq_stride, positions, rows, NH, NKV, hs);
}

void rope_append_attend_at(float* out, float* qkv, float* k_cache, float* v_cache, const float* cos, const float* sin,
                           int64_t seq_stride, const int32_t* positions, int rows, int NH, int NKV, int hs,
                           int max_len) {
  rope_kv_append_at(qkv, k_cache, v_cache, cos, sin, seq_stride, positions, rows, NH, NKV, hs);
  decode_attention_at(out, qkv, int64_t{NH + 2 * NKV} * hs, k_cache, v_cache, seq_stride, positions, rows, NH, NKV, hs,
                      max_len);
}

}  // namespace st
