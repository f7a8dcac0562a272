// GELU, tanh approximation (GPT-2's; PyTorch gelu(approximate="tanh")), and the residual add.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/grad_write.h"

namespace st {

// out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, int64_t n);
// Accumulates: dinp[i] += gelu'(inp[i]) * dout[i]. With write = kOverwrite, dinp[i] = gelu'(inp[i]) * dout[i]
// (dinp is not read, and may be dout: in place).
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n,
                   GradWrite write = GradWrite::kAccumulate);

// out[i] = a[i] + b[i]. out may alias a or b.
void residual_forward(float* out, const float* a, const float* b, int64_t n);

}  // namespace st
