// RMSNorm over the last dimension, as Hugging Face's LlamaRMSNorm: out = inp * rstd * weight with
// rstd = 1 / sqrt(mean(inp^2) + eps), no bias, no mean subtraction. CPU fp32 reference.
//
// Each output feeds a linear layer (the forward's q/k/v and gate/up, the backward's residual gradient into o and
// down), which under train.fp8 = tensorwise casts it with one scale from its largest magnitude: with `amax` not null,
// the tensor written gets that maximum folded into *amax as it is written (fp8_fold_maximum, kernels/fp8.h; zero
// *amax first to get fp8_maxima's bits of the tensor).
#pragma once

#include <cstdint>

#include "shardtrain/kernels/fp8.h"
#include "shardtrain/kernels/grad_write.h"

namespace st {

// For each of N rows of C: out = inp * rstd * weight. Saves rstd[N] for backward.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, float eps, int64_t N, int C,
                     unsigned* amax = nullptr);

// rmsnorm_forward's out cast to FP8 as it is computed, with a maximum known ahead (train.fp8=delayed), so that out
// itself is never stored: rstd[N] saved as rmsnorm_forward saves it, out's codes into q [N, C] and transposed into
// q_t [C, N] (either may be null), 1 / scale into *inverse_scale and out's maximum folded into *own (may be null), as
// swiglu_forward_fp8 (kernels/swiglu.h) casts its output. What the q/k/v and gate/up projections read of their input.
void rmsnorm_forward_fp8(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, float* rstd, const float* inp,
                         const float* weight, float eps, int64_t N, int C, Fp8Format f, const unsigned* amax);

// Accumulates dinp += ... (the residual stream's gradient) and dweight += ... . Deterministic over threads. With
// param_write = kOverwrite, dweight is written instead (not read). dweight may be null (a frozen weight). amax: of
// dinp as accumulated.
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int64_t N, int C, GradWrite param_write = GradWrite::kAccumulate,
                      unsigned* amax = nullptr);

}  // namespace st
