#include "shardtrain/kernels/adamw.h"

#include <cmath>

#include "parallel.h"

namespace st {

using kernels_internal::kMinParallelWork;

void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, const AdamWParams& p) {
  // Scalars are formed in double and rounded once, as PyTorch does with its Python-float hyperparameters.
  const double t = static_cast<double>(p.step);
  const float decay = static_cast<float>(1.0 - static_cast<double>(p.lr) * p.weight_decay);
  const float step_size = static_cast<float>(p.lr / (1.0 - std::pow(static_cast<double>(p.beta1), t)));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(p.beta2), t)));
  const float b1 = p.beta1, b2 = p.beta2;
  const float omb1 = 1.0f - b1, omb2 = 1.0f - b2;
  const float eps = p.eps, gs = p.grad_scale;
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * gs;
    const float mi = b1 * m[i] + omb1 * g;
    const float vi = b2 * v[i] + omb2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    param[i] = param[i] * decay - step_size * (mi / denom);  // addcdiv order: m / denom first
  }
}

}  // namespace st
