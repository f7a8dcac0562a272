#include "shardtrain/kernels/rmsnorm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "parallel.h"
#include "shardtrain/kernels/fp8.h"

namespace st {

using kernels_internal::kMinParallelWork;

namespace {
// dweight is reduced over rows by blocks of columns, one block per thread, in row order: the sum order is fixed
// whatever the thread count, so the result is bitwise reproducible.
constexpr int kColBlock = 32;
}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, float eps, int64_t N, int C,
                     unsigned* amax) {
#pragma omp parallel for schedule(static) if (N * C >= kMinParallelWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    double ss = 0;  // in double, as layernorm_forward's reductions
#pragma omp simd reduction(+ : ss)
    for (int c = 0; c < C; ++c) ss += static_cast<double>(x[c]) * x[c];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / C + static_cast<double>(eps)));
    float* o = out + n * C;
    for (int c = 0; c < C; ++c) o[c] = x[c] * r * weight[c];
    rstd[n] = r;
  }
  if (amax != nullptr) fp8_fold_maximum(out, N * C, amax);
}

void rmsnorm_forward_fp8(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, float* rstd, const float* inp,
                         const float* weight, float eps, int64_t N, int C, Fp8Format f, const unsigned* amax) {
  std::vector<float> out(static_cast<size_t>(N) * static_cast<size_t>(C));
  rmsnorm_forward(out.data(), rstd, inp, weight, eps, N, C);
  fp8_quantize_ahead(out.data(), N, C, f, amax, q, q_t, inverse_scale, own);
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int C, GradWrite param_write, unsigned* amax) {
  const bool param_add = param_write == GradWrite::kAccumulate;
  // dinp = rstd * (dn - norm * mean(dn * norm)), with norm = inp * rstd and dn = weight * dout; rows independent.
#pragma omp parallel for schedule(static) if (N * C >= kMinParallelWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    const float* d = dout + n * C;
    const float r = rstd[n];
    double sum_dn_norm = 0;
#pragma omp simd reduction(+ : sum_dn_norm)
    for (int c = 0; c < C; ++c) sum_dn_norm += static_cast<double>(weight[c] * d[c]) * (x[c] * r);
    const float mean_dn_norm = static_cast<float>(sum_dn_norm / C);
    float* g = dinp + n * C;
    for (int c = 0; c < C; ++c) g[c] += (weight[c] * d[c] - x[c] * r * mean_dn_norm) * r;
  }
  if (amax != nullptr) fp8_fold_maximum(dinp, N * C, amax);

  if (dweight == nullptr) return;  // a frozen weight
  const int nblocks = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (N * C >= kMinParallelWork)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kColBlock;
    const int w = std::min(C, c0 + kColBlock) - c0;
    double acc[kColBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      const float* x = inp + n * C + c0;
      const float* d = dout + n * C + c0;
      const float r = rstd[n];
      for (int j = 0; j < w; ++j) acc[j] += static_cast<double>(x[j] * r) * d[j];
    }
    for (int j = 0; j < w; ++j) dweight[c0 + j] = (param_add ? dweight[c0 + j] : 0.0f) + static_cast<float>(acc[j]);
  }
}

}  // namespace st
