#include "shardtrain/kernels/attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "parallel.h"
#include "shardtrain/core/error.h"
#include "vec_math.h"

namespace st {

using kernels_internal::exp_fast;
using kernels_internal::exp_range;
using kernels_internal::ExpRange;
using kernels_internal::kMinParallelWork;

// Layout: per (b, h), q/k/v are T x hs matrices strided inside qkv (leading dimension QKV = (NH + 2 NKV) hs) and
// the head's slice of out/dout is T x hs (leading dimension C = NH hs), so every product is an sgemm on the buffers
// in place. Query head h reads K/V head h / (NH / NKV).
//
// Causality by blocks of kQueryBlock query rows: rows [i0, i1) only see keys [0, i1), so each product is
// restricted to those columns. At T = 1024 that skips ~44% of the flops of the full T x T products; the
// few masked entries computed inside a diagonal block are zeroed by the softmax pass. Short sequences
// (T <= kQueryBlock) take one sgemm per product.
//
// The (b, h, block) loop is sequential: the pthread OpenBLAS threads each sgemm itself, and calling it
// from inside an OpenMP region would oversubscribe the cores. The element-wise softmax work runs under
// OpenMP.

namespace {

constexpr int kQueryBlock = 128;

// Row-major sgemm with the leading dimensions spelled out at the call site.
void gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta, c,
              static_cast<int>(ldc));
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int NKV, int hs) {
  ST_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0 && hs > 0, "NH = ", NH, " is not a multiple of NKV = ", NKV);
  const int64_t C = static_cast<int64_t>(NH) * hs;
  const int64_t QKV = static_cast<int64_t>(NH + 2 * NKV) * hs;
  const int group = NH / NKV;
  const int64_t TT = static_cast<int64_t>(T) * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));

  // S[i0:i1, 0:i1] = scale * Q[i0:i1] K[0:i1]^T, written into att.
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* q = qkv + static_cast<int64_t>(b) * T * QKV + h * hs;
      const float* k = qkv + static_cast<int64_t>(b) * T * QKV + C + (h / group) * hs;
      float* s = att + (static_cast<int64_t>(b) * NH + h) * TT;
      for (int i0 = 0; i0 < T; i0 += kQueryBlock) {
        const int i1 = std::min(T, i0 + kQueryBlock);
        gemm(CblasNoTrans, CblasTrans, i1 - i0, i1, hs, scale, q + i0 * QKV, QKV, k, QKV, 0.0f,
             s + static_cast<int64_t>(i0) * T, T);
      }
    }
  }

  // Row softmax over keys [0, i]; every key > i (computed or not) is written 0.
  const int64_t rows = static_cast<int64_t>(B) * NH * T;
  const ExpRange er = exp_range();
#pragma omp parallel for schedule(static) if (rows * T >= 2 * kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int i = static_cast<int>(r % T);
    float* s = att + r * T;
    float mx = s[0];
#pragma omp simd reduction(max : mx)
    for (int j = 0; j <= i; ++j) mx = s[j] > mx ? s[j] : mx;
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j <= i; ++j) {
      const float e = exp_fast(s[j] - mx, er);
      s[j] = e;
      sum += e;
    }
    const float inv = static_cast<float>(1.0 / sum);
#pragma omp simd
    for (int j = 0; j <= i; ++j) s[j] *= inv;
    for (int j = i + 1; j < T; ++j) s[j] = 0.0f;
  }

  // out[i0:i1] = P[i0:i1, 0:i1] V[0:i1].
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const float* v = qkv + static_cast<int64_t>(b) * T * QKV + C + (NKV + h / group) * static_cast<int64_t>(hs);
      const float* p = att + (static_cast<int64_t>(b) * NH + h) * TT;
      float* o = out + static_cast<int64_t>(b) * T * C + h * hs;
      for (int i0 = 0; i0 < T; i0 += kQueryBlock) {
        const int i1 = std::min(T, i0 + kQueryBlock);
        gemm(CblasNoTrans, CblasNoTrans, i1 - i0, hs, i1, 1.0f, p + static_cast<int64_t>(i0) * T, T, v, QKV, 0.0f,
             o + static_cast<int64_t>(i0) * C, C);
      }
    }
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int NH,
                        int NKV, int hs) {
  ST_CHECK(NH > 0 && NKV > 0 && NH % NKV == 0 && hs > 0, "NH = ", NH, " is not a multiple of NKV = ", NKV);
  const int64_t C = static_cast<int64_t>(NH) * hs;
  const int64_t C3 = static_cast<int64_t>(NH + 2 * NKV) * hs;  // the row stride of qkv
  const int group = NH / NKV;
  const int64_t TT = static_cast<int64_t>(T) * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  std::vector<float> ds(TT);  // dP, then dS in place; one (b, h) at a time
  float* dsp = ds.data();

  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      const int64_t row = static_cast<int64_t>(b) * T * C3;
      const int64_t kv = C + static_cast<int64_t>(h / group) * hs;  // K head; its V head is NKV heads further
      const int64_t to_v = static_cast<int64_t>(NKV) * hs;
      const float* q = qkv + row + h * hs;
      const float* k = qkv + row + kv;
      const float* v = k + to_v;
      float* dq = dqkv + row + h * hs;
      float* dk = dqkv + row + kv;
      float* dv = dk + to_v;
      const float* p = att + (static_cast<int64_t>(b) * NH + h) * TT;
      const float* dout_h = dout + static_cast<int64_t>(b) * T * C + h * hs;

      // dP[i0:i1, 0:i1] = dout[i0:i1] V[0:i1]^T;  dV[0:i1] += P[i0:i1, 0:i1]^T dout[i0:i1].
      for (int i0 = 0; i0 < T; i0 += kQueryBlock) {
        const int i1 = std::min(T, i0 + kQueryBlock);
        const int64_t row0 = static_cast<int64_t>(i0) * T;
        gemm(CblasNoTrans, CblasTrans, i1 - i0, i1, hs, 1.0f, dout_h + i0 * static_cast<int64_t>(C), C, v, C3, 0.0f,
             dsp + row0, T);
        gemm(CblasTrans, CblasNoTrans, i1, hs, i1 - i0, 1.0f, p + row0, T, dout_h + i0 * static_cast<int64_t>(C), C,
             1.0f, dv, C3);
      }

      // Softmax backward: dS = P * (dP - sum_j P dP) over keys [0, i]; masked entries (P = 0) get dS = 0.
#pragma omp parallel for schedule(static) if (TT >= 2 * kMinParallelWork)
      for (int i = 0; i < T; ++i) {
        const float* pr = p + static_cast<int64_t>(i) * T;
        float* dr = dsp + static_cast<int64_t>(i) * T;
        double dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int j = 0; j <= i; ++j) dot += static_cast<double>(pr[j]) * dr[j];
        const float dotf = static_cast<float>(dot);
#pragma omp simd
        for (int j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dotf);
        for (int j = i + 1; j < T; ++j) dr[j] = 0.0f;
      }

      // S = scale Q K^T:  dQ[i0:i1] += scale dS[i0:i1, 0:i1] K[0:i1];  dK[0:i1] += scale dS[i0:i1, 0:i1]^T Q[i0:i1].
      for (int i0 = 0; i0 < T; i0 += kQueryBlock) {
        const int i1 = std::min(T, i0 + kQueryBlock);
        const int64_t row0 = static_cast<int64_t>(i0) * T;
        gemm(CblasNoTrans, CblasNoTrans, i1 - i0, hs, i1, scale, dsp + row0, T, k, C3, 1.0f, dq + i0 * C3, C3);
        gemm(CblasTrans, CblasNoTrans, i1, hs, i1 - i0, scale, dsp + row0, T, q + i0 * C3, C3, 1.0f, dk, C3);
      }
    }
  }
}

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  ST_CHECK(NH > 0 && C % NH == 0, "C = ", C, " is not a multiple of NH = ", NH);
  attention_forward(out, att, qkv, B, T, NH, NH, C / NH);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH) {
  ST_CHECK(NH > 0 && C % NH == 0, "C = ", C, " is not a multiple of NH = ", NH);
  attention_backward(dqkv, dout, qkv, att, B, T, NH, NH, C / NH);
}

}  // namespace st
