#include "shardtrain/kernels/layernorm.h"

#include <algorithm>
#include <cmath>

#include "parallel.h"
#include "shardtrain/kernels/fp8.h"

namespace st {

using kernels_internal::kMinParallelWork;

namespace {
// dweight/dbias are reduced over rows by blocks of columns, one block per thread, in row order: the sum
// order is fixed whatever the thread count, so the result is bitwise reproducible.
constexpr int kColBlock = 32;
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int64_t N, int C, unsigned* amax) {
#pragma omp parallel for schedule(static) if (N * C >= kMinParallelWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    // Row reductions in double: they cost nothing next to the GEMMs and keep the two-pass variance exact
    // enough for PyTorch parity.
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; ++c) s += x[c];
    const double m = s / C;
    double ss = 0;
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; ++c) {
      const double d = x[c] - m;
      ss += d * d;
    }
    const float mf = static_cast<float>(m);
    const float r = static_cast<float>(1.0 / std::sqrt(ss / C + static_cast<double>(kLayerNormEps)));
    float* o = out + n * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - mf) * r * weight[c] + bias[c];
    mean[n] = mf;
    rstd[n] = r;
  }
  if (amax != nullptr) fp8_fold_maximum(out, N * C, amax);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int C,
                        GradWrite param_write) {
  const bool param_add = param_write == GradWrite::kAccumulate;
  // dinp: rows are independent.
#pragma omp parallel for schedule(static) if (N * C >= kMinParallelWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    const float* d = dout + n * C;
    const float m = mean[n];
    const float r = rstd[n];
    double sum_dn = 0, sum_dn_norm = 0;
#pragma omp simd reduction(+ : sum_dn, sum_dn_norm)
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * r;
      const float dn = weight[c] * d[c];
      sum_dn += dn;
      sum_dn_norm += static_cast<double>(dn) * norm;
    }
    const float mean_dn = static_cast<float>(sum_dn / C);
    const float mean_dn_norm = static_cast<float>(sum_dn_norm / C);
    float* g = dinp + n * C;
    for (int c = 0; c < C; ++c) {
      const float norm = (x[c] - m) * r;
      const float dn = weight[c] * d[c];
      g[c] += (dn - mean_dn - norm * mean_dn_norm) * r;
    }
  }

  if (dweight == nullptr) return;  // frozen weight and bias
  const int nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (N * C >= kMinParallelWork)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kColBlock;
    const int w = std::min(C, c0 + kColBlock) - c0;
    double acc_w[kColBlock] = {};
    double acc_b[kColBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C + c0;
      const float* d = dout + n * C + c0;
      const float m = mean[n];
      const float r = rstd[n];
      for (int j = 0; j < w; ++j) {
        const float norm = (x[j] - m) * r;
        acc_w[j] += static_cast<double>(norm) * d[j];
        acc_b[j] += d[j];
      }
    }
    for (int j = 0; j < w; ++j) {
      dweight[c0 + j] = (param_add ? dweight[c0 + j] : 0.0f) + static_cast<float>(acc_w[j]);
      dbias[c0 + j] = (param_add ? dbias[c0 + j] : 0.0f) + static_cast<float>(acc_b[j]);
    }
  }
}

}  // namespace st
