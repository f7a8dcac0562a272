#include "shardtrain/kernels/lora.h"

#include <cblas.h>

#include <algorithm>
#include <climits>

#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"

namespace st {

int64_t LoraStack::b_rows() const {
  int64_t rows = 0;
  for (const LoraSlice& sl : slices) rows += sl.rows;
  return rows;
}

void check_lora_stack(const char* what, int64_t N, int64_t ldo, const LoraStack& s) {
  ST_CHECK(N >= 0 && s.in > 0 && s.r > 0 && !s.slices.empty(), what, ": N ", N, ", in ", s.in, ", r ", s.r, ", ",
           s.slices.size(), " adapters");
  for (const LoraSlice& sl : s.slices)
    ST_CHECK(sl.row0 >= 0 && sl.rows > 0 && sl.row0 + sl.rows <= ldo, what, ": an adapter's columns [", sl.row0, ", ",
             sl.row0 + sl.rows, ") outside the output's ", ldo);
}

namespace {

// The CPU's GEMMs take int dimensions.
void check_stack(const char* what, int64_t N, int64_t ldo, const LoraStack& s) {
  check_lora_stack(what, N, ldo, s);
  ST_CHECK(N <= INT_MAX, what, ": N ", N, " rows, more than OpenBLAS takes");
}

}  // namespace

void lora_forward(float* out, int64_t ldo, GradWrite out_write, float* h, const float* x, const float* A,
                  const float* B, int64_t N, const LoraStack& s, float scale) {
  check_stack("lora_forward", N, ldo, s);
  if (N == 0) return;
  const int n = static_cast<int>(N), ld = static_cast<int>(ldo), w = s.width(), r = s.r;
  const float beta = out_write == GradWrite::kAccumulate ? 1.0f : 0.0f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, w, s.in, 1.0f, x, s.in, A, s.in, 0.0f, h, w);
  const float* Bj = B;
  for (size_t j = 0; j < s.slices.size(); ++j) {
    const int rows = static_cast<int>(s.slices[j].rows);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, r, scale, h + j * r, w, Bj, r, beta,
                out + s.slices[j].row0, ld);
    Bj += int64_t{rows} * r;
  }
}

void lora_backward(float* dx, GradWrite dx_write, float* dA, float* dB, float* dh, const float* dout, int64_t ldo,
                   const float* x, const float* h, const float* A, const float* B, int64_t N, const LoraStack& s,
                   float scale, GradWrite param_write) {
  check_stack("lora_backward", N, ldo, s);
  const bool add = param_write == GradWrite::kAccumulate;
  const int w = s.width(), r = s.r;
  if (N == 0) {  // no rows: the written gradients are the empty sums
    if (!add) {
      std::fill(dA, dA + int64_t{w} * s.in, 0.0f);
      std::fill(dB, dB + s.b_rows() * r, 0.0f);
    }
    return;
  }
  const int n = static_cast<int>(N), ld = static_cast<int>(ldo);
  const float beta = add ? 1.0f : 0.0f;
  int64_t b_row = 0;
  for (size_t j = 0; j < s.slices.size(); ++j) {
    const int rows = static_cast<int>(s.slices[j].rows);
    const float* g = dout + s.slices[j].row0;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, r, rows, scale, g, ld, B + b_row * r, r, 0.0f, dh + j * r,
                w);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rows, r, n, scale, g, ld, h + j * r, w, beta, dB + b_row * r,
                r);
    b_row += rows;
  }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, w, s.in, n, 1.0f, dh, w, x, s.in, beta, dA, s.in);
  if (dx != nullptr)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, s.in, w, 1.0f, dh, w, A, s.in,
                dx_write == GradWrite::kAccumulate ? 1.0f : 0.0f, dx, s.in);
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
