#include "shardtrain/kernels/lora.h"

#include <cblas.h>

#include <algorithm>
#include <climits>

#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"

namespace st {

void lora_forward(float* out, int64_t ldo, float* h, const float* x, const float* A, const float* B, int64_t N, int in,
                  int r, int rows, float scale) {
  ST_CHECK(N >= 0 && N <= INT_MAX && ldo >= rows, "lora_forward: N ", N, ", ldo ", ldo, ", rows ", rows);
  if (N == 0) return;
  const int n = static_cast<int>(N), ld = static_cast<int>(ldo);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, r, in, 1.0f, x, in, A, in, 0.0f, h, r);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, r, scale, h, r, B, r, 1.0f, out, ld);
}

void lora_backward(float* dx, float* dA, float* dB, float* dh, const float* dout, int64_t ldo, const float* x,
                   const float* h, const float* A, const float* B, int64_t N, int in, int r, int rows, float scale,
                   GradWrite param_write) {
  ST_CHECK(N >= 0 && N <= INT_MAX && ldo >= rows, "lora_backward: N ", N, ", ldo ", ldo, ", rows ", rows);
  const bool add = param_write == GradWrite::kAccumulate;
  if (N == 0) {  // no rows: the written gradients are the empty sums
    if (!add) {
      std::fill(dA, dA + int64_t{r} * in, 0.0f);
      std::fill(dB, dB + int64_t{rows} * r, 0.0f);
    }
    return;
  }
  const int n = static_cast<int>(N), ld = static_cast<int>(ldo);
  const float beta = add ? 1.0f : 0.0f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, r, rows, scale, dout, ld, B, r, 0.0f, dh, r);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, r, n, scale, dout, ld, h, r, beta, dB, r);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, in, n, 1.0f, dh, r, x, in, beta, dA, in);
  if (dx != nullptr) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, r, 1.0f, dh, r, A, in, 1.0f, dx, in);
}

namespace {

// keep(n, c) as the header defines it: the scale 1 / (1 - p), or 0.
inline float dropout_factor(const LoraDropoutKey& k, int64_t n, int in, int c, float inv) {
  const int64_t sequence = k.first_sequence + n / k.rows_per_sequence, position = n % k.rows_per_sequence;
  const uint64_t index = static_cast<uint64_t>((sequence * k.seq_stride + position) * in + c);
  const float u = static_cast<float>(random_bits_at(k.seed, k.stream, index) >> 40) * (1.0f / 16777216.0f);
  return u >= k.p ? inv : 0.0f;
}

}  // namespace

void lora_dropout(float* out, const float* x, int64_t N, int in, const LoraDropoutKey& key) {
  const float inv = 1.0f / (1.0f - key.p);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int c = 0; c < in; ++c) out[n * in + c] = x[n * in + c] * dropout_factor(key, n, in, c, inv);
}

void lora_dropout_backward(float* dx, float* dxd, const float* dh, const float* A, int64_t N, int in, int r,
                           const LoraDropoutKey& key) {
  ST_CHECK(N >= 0 && N <= INT_MAX, "lora_dropout_backward: N ", N);
  if (N == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(N), in, r, 1.0f, dh, r, A, in, 0.0f, dxd, in);
  const float inv = 1.0f / (1.0f - key.p);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n)
    for (int c = 0; c < in; ++c) dx[n * in + c] += dxd[n * in + c] * dropout_factor(key, n, in, c, inv);
}

}  // namespace st
