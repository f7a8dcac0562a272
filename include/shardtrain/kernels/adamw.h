// AdamW with decoupled weight decay, PyTorch's formulation (torch.optim.AdamW, non-amsgrad):
//   p *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// where g = grad * grad_scale (grad_scale carries the clip coefficient). CPU fp32 reference.
#pragma once

#include <cstdint>

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

// A contiguous run of a shard updated with one set of parameters (one weight-decay setting): elements
// [offset, offset + count) of the shard's param/m/v/grad arrays.
struct AdamWRun {
  int64_t offset = 0;
  int64_t count = 0;
  AdamWParams params;
};

}  // namespace st
