// AdamW with decoupled weight decay, PyTorch's formulation (torch.optim.AdamW, non-amsgrad):
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// where g = grad * grad_scale (grad_scale carries the clip coefficient). CPU fp32 reference.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "shardtrain/core/host_device.h"

namespace st {

struct AdamWParams {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0;  // 0 for tensors that are not decayed
  int64_t step = 1;        // 1-based count of updates including this one (bias correction)
  float grad_scale = 1;    // multiplies grad before use
};

void adamw_update(float* param, float* m, float* v, const float* grad, int64_t n, const AdamWParams& p);

// The per-step scalars of the update, formed in double and rounded once (as PyTorch does with its Python-float
// hyperparameters). Every implementation (this reference, the host SIMD kernels, the GPU kernel) uses these, in
// this order per element:
//   g = grad * gs;  m = b1 m + omb1 g;  v = b2 v + (omb2 g) g;
//   param = param * decay - step_size * (m / (sqrt(v) / bc2_sqrt + eps))
struct AdamWScalars {
  float decay, step_size, bc2_sqrt, b1, b2, omb1, omb2, eps, gs;
};
AdamWScalars adamw_scalars(const AdamWParams& p);

// One element of the update in that order (the scalar loops of every host implementation). Compiled without
// fused multiply-add (x86-64-v2 has none, and the SIMD file turns contraction off).
inline void adamw_element(const AdamWScalars& s, float& param, float& m, float& v, float grad) {
  const float g = grad * s.gs;
  m = s.b1 * m + s.omb1 * g;
  v = s.b2 * v + s.omb2 * g * g;
  const float denom = std::sqrt(v) / s.bc2_sqrt + s.eps;
  param = param * s.decay - s.step_size * (m / denom);  // addcdiv order: m / denom first
}

// A contiguous run of a shard updated with one set of parameters (one weight-decay setting): elements
// [offset, offset + count) of the shard's param/m/v/grad arrays.
struct AdamWRun {
  int64_t offset = 0;
  int64_t count = 0;
  AdamWParams params;
};

// The end of a step, decided from the step's global sums: its gradient norm, whether it is skipped, and the factor
// AdamW multiplies the gradients by. One function for the host (StepEngine) and the device (gpu::decide_step, which
// the cuda backend runs so that no host round trip sits between the backward and the optimizer): the same bits.
struct StepGate {
  double grad_norm = 0;  // sqrt(sum of squares) / loss_scale: the unscaled gradient's global norm
  float grad_scale = 1;  // clip coefficient / loss_scale: replaces every run's AdamWParams::grad_scale
  int32_t skip = 0;      // 1: the loss or the norm is not finite; AdamW leaves the state untouched
};

// The gradient clip coefficient (optim.grad_clip; 0 or less: no clipping): grad_clip / (norm + 1e-6) when below 1.
ST_HOST_DEVICE inline float clip_factor(float grad_clip, double grad_norm) {
  if (grad_clip <= 0.0f) return 1.0f;
  const double coef = grad_clip / (grad_norm + 1e-6);
  return coef < 1.0 ? static_cast<float>(coef) : 1.0f;
}

ST_HOST_DEVICE inline bool finite_double(double x) {
#ifdef __CUDA_ARCH__
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// sum_sq: the global sum of squares of the (loss-scaled) gradient; loss: any global sum of the step's losses
// (only its finiteness counts).
ST_HOST_DEVICE inline StepGate decide_step(double sum_sq, double loss, double loss_scale, float grad_clip) {
  StepGate g;
  g.grad_norm = sqrt(sum_sq) / loss_scale;
  g.skip = finite_double(loss) && finite_double(g.grad_norm) ? 0 : 1;
  g.grad_scale = static_cast<float>(static_cast<double>(clip_factor(grad_clip, g.grad_norm)) / loss_scale);
  return g;
}

// adamw_update over each run [offset, offset + count) of the arrays, with the run's parameters. With a gate, its
// grad_scale replaces the runs', and a skipping gate leaves everything untouched.
void adamw_update_runs(float* param, float* m, float* v, const float* grad, const std::vector<AdamWRun>& runs,
                       const StepGate* gate = nullptr);

// Every field equal (floats by value): the same update, bit for bit (optimizer offload's speculative step).
bool operator==(const AdamWParams& a, const AdamWParams& b);
bool operator==(const AdamWRun& a, const AdamWRun& b);

}  // namespace st
