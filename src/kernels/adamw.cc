#include "shardtrain/kernels/adamw.h"

#include <cmath>

#include "parallel.h"

namespace st {

using kernels_internal::kMinParallelWork;

AdamWScalars adamw_scalars(const AdamWParams& p) {
  const double t = static_cast<double>(p.step);
  AdamWScalars s;
  s.decay = static_cast<float>(1.0 - static_cast<double>(p.lr) * p.weight_decay);
  s.step_size = static_cast<float>(p.lr / (1.0 - std::pow(static_cast<double>(p.beta1), t)));
  s.bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(p.beta2), t)));
  s.b1 = p.beta1;
  s.b2 = p.beta2;
  s.omb1 = 1.0f - p.beta1;
  s.omb2 = 1.0f - p.beta2;
  s.eps = p.eps;
  s.gs = p.grad_scale;
  return s;
}

void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, const AdamWParams& p) {
  const AdamWScalars s = adamw_scalars(p);
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) adamw_element(s, param[i], m[i], v[i], grad[i]);
}

void adamw_update_runs(float* param, float* m, float* v, const float* grad, const std::vector<AdamWRun>& runs,
                       const StepGate* gate) {
  if (gate != nullptr && gate->skip != 0) return;
  for (const AdamWRun& r : runs) {
    AdamWParams p = r.params;
    if (gate != nullptr) p.grad_scale = gate->grad_scale;
    adamw_update(param + r.offset, m + r.offset, v + r.offset, grad + r.offset, r.count, p);
  }
}

bool operator==(const AdamWParams& a, const AdamWParams& b) {
  return a.lr == b.lr && a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.eps == b.eps &&
         a.weight_decay == b.weight_decay && a.step == b.step && a.grad_scale == b.grad_scale;
}

bool operator==(const AdamWRun& a, const AdamWRun& b) {
  return a.offset == b.offset && a.count == b.count && a.params == b.params;
}

}  // namespace st
