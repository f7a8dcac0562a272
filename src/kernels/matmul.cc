#include "shardtrain/kernels/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <climits>

#include "parallel.h"
#include "shardtrain/kernels/gelu.h"
#include "shardtrain/kernels/rmsnorm.h"
#include "shardtrain/kernels/swiglu.h"

namespace st {

using kernels_internal::kMinParallelWork;

namespace {
// CBLAS dimensions are int; N (rows = tokens) is int64 in the contract, so GEMMs over N go in chunks.
constexpr int64_t kMaxRows = INT_MAX / 2;
constexpr int kColBlock = 32;
}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C, int OC) {
  float beta = 0.0f;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static) if (N * OC >= kMinParallelWork)
    for (int64_t n = 0; n < N; ++n) std::copy(bias, bias + OC, out + n * OC);
    beta = 1.0f;
  }
  for (int64_t n0 = 0; n0 < N; n0 += kMaxRows) {
    const int rows = static_cast<int>(std::min(kMaxRows, N - n0));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, OC, C, 1.0f, inp + n0 * C, C, weight, C, beta,
                out + n0 * OC, OC);
  }
}

void matmul_forward_residual(float* out, const float* inp, const float* weight, const float* bias,
                             const float* residual, int64_t N, int C, int OC) {
#pragma omp parallel for schedule(static) if (N * OC >= kMinParallelWork)
  for (int64_t n = 0; n < N; ++n) {
    float* o = out + n * OC;
    const float* r = residual + n * OC;
    for (int j = 0; j < OC; ++j) o[j] = r[j] + (bias != nullptr ? bias[j] : 0.0f);
  }
  for (int64_t n0 = 0; n0 < N; n0 += kMaxRows) {
    const int rows = static_cast<int>(std::min(kMaxRows, N - n0));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, OC, C, 1.0f, inp + n0 * C, C, weight, C, 1.0f,
                out + n0 * OC, OC);
  }
}

void rmsnorm_matmul_forward(float* out, float* norm, float* rstd, const float* inp, const float* norm_weight, float eps,
                            const float* weight, const float* bias, int64_t N, int C, int OC) {
  rmsnorm_forward(norm, rstd, inp, norm_weight, eps, N, C);
  matmul_forward(out, norm, weight, bias, N, C, OC);
}

void swiglu_matmul_forward_residual(float* out, float* mlp, const float* gate_up, const float* weight,
                                    const float* bias, const float* residual, int64_t N, int F, int OC) {
  swiglu_forward(mlp, gate_up, N, F);
  matmul_forward_residual(out, mlp, weight, bias, residual, N, F, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int C, int OC, GradWrite dinp_write, GradWrite param_write) {
  const float dinp_beta = dinp_write == GradWrite::kAccumulate ? 1.0f : 0.0f;
  const bool param_add = param_write == GradWrite::kAccumulate;
  for (int64_t n0 = 0; n0 < N; n0 += kMaxRows) {
    const int rows = static_cast<int>(std::min(kMaxRows, N - n0));
    if (dinp != nullptr) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, C, OC, 1.0f, dout + n0 * OC, OC, weight, C,
                  dinp_beta, dinp + n0 * C, C);
    }
    // The first row block writes dweight when overwriting; the later ones add to it.
    const float dweight_beta = param_add || n0 > 0 ? 1.0f : 0.0f;
    if (dweight != nullptr)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, rows, 1.0f, dout + n0 * OC, OC, inp + n0 * C, C,
                  dweight_beta, dweight, C);
  }
  if (dbias != nullptr) {
    // Blocks of columns, rows summed in order by one thread each: deterministic for any thread count.
    const int nblocks = (OC + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (N * OC >= kMinParallelWork)
    for (int blk = 0; blk < nblocks; ++blk) {
      const int o0 = blk * kColBlock;
      const int w = std::min(OC, o0 + kColBlock) - o0;
      double acc[kColBlock] = {};
      for (int64_t n = 0; n < N; ++n) {
        const float* d = dout + n * OC + o0;
        for (int j = 0; j < w; ++j) acc[j] += d[j];
      }
      for (int j = 0; j < w; ++j) dbias[o0 + j] = (param_add ? dbias[o0 + j] : 0.0f) + static_cast<float>(acc[j]);
    }
  }
}

void matmul_backward_gelu(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* pre_gelu, int64_t N, int C, int OC, GradWrite param_write) {
  matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, GradWrite::kOverwrite, param_write);
  gelu_backward(dinp, pre_gelu, dinp, N * C, GradWrite::kOverwrite);
}

}  // namespace st
