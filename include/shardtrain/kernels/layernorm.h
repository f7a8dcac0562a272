// LayerNorm over the last dimension, eps = 1e-5 (as PyTorch's default). CPU fp32 reference.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/grad_write.h"

namespace st {

inline constexpr float kLayerNormEps = 1e-5f;

// For each of N rows of C: out = (inp - mean) * rstd * weight + bias. Saves mean[N] and rstd[N] for
// backward (rstd = 1/sqrt(var + eps), biased variance). out feeds a linear layer (GPT-2's qkv and fc): with `amax` not
// null, its maximum folds into *amax (fp8_fold_maximum, kernels/fp8.h), what train.fp8 = tensorwise scales that
// layer's cast by.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight, const float* bias,
                       int64_t N, int C, unsigned* amax = nullptr);

// Accumulates: dinp += ..., dweight += ..., dbias += ... . Deterministic over threads. With param_write =
// kOverwrite, dweight and dbias are written instead (not read); dinp still accumulates (the residual stream's
// gradient).
// dweight and dbias may both be null (a frozen weight and bias).
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int64_t N, int C,
                        GradWrite param_write = GradWrite::kAccumulate);

}  // namespace st
