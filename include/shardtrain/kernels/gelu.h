// GELU, tanh approximation (GPT-2's; PyTorch gelu(approximate="tanh")), and the residual add.
#pragma once

#include <cstdint>

#include "shardtrain/core/host_device.h"
#include "shardtrain/kernels/grad_write.h"

namespace st {

inline constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
inline constexpr float kGeluCube = 0.044715f;

// The pieces of GELU that the CPU reference (gelu.cc) and the CUDA kernels (gelu.cu) share, so that both round
// alike; each takes e^{-2u} from its own exp. u = sqrt(2/pi) (x + 0.044715 x^3) is the argument of tanh, and with
// s = sigmoid(2u) = 1 / (1 + e^{-2u}) = 0.5 (1 + tanh(u)), gelu(x) = x s = x / (1 + e^{-2u}).
ST_HOST_DEVICE inline float gelu_tanh_arg(float x) { return kGeluScale * (x + kGeluCube * x * x * x); }
ST_HOST_DEVICE inline float gelu_tanh_arg_grad(float x) { return kGeluScale * (1.0f + 3.0f * kGeluCube * x * x); }
// gelu'(x) = s + x * 2 s (1 - s) * u', since 0.5 sech^2(u) = 2 s (1 - s).
ST_HOST_DEVICE inline float gelu_grad_from_sigmoid(float x, float s) {
  return s + 2.0f * x * s * (1.0f - s) * gelu_tanh_arg_grad(x);
}

// out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). out feeds GPT-2's mlp.proj: with `amax` not null, its
// maximum folds into *amax (fp8_fold_maximum, kernels/fp8.h), what train.fp8 = tensorwise scales that layer's cast by.
void gelu_forward(float* out, const float* inp, int64_t n, unsigned* amax = nullptr);
// Accumulates: dinp[i] += gelu'(inp[i]) * dout[i]. With write = kOverwrite, dinp[i] = gelu'(inp[i]) * dout[i]
// (dinp is not read, and may be dout: in place).
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n,
                   GradWrite write = GradWrite::kAccumulate);

// out[i] = a[i] + b[i]. out may alias a or b.
void residual_forward(float* out, const float* a, const float* b, int64_t n);

}  // namespace st
