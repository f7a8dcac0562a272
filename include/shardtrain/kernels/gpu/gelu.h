// GELU (tanh approximation) and the residual add on the GPU: the CUDA versions of kernels/gelu.h, same
// operands and meaning, for activations T in {float, bf16, fp16} (fp32 arithmetic). Device pointers,
// asynchronous on ctx.stream; no scratch.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/grad_write.h"

namespace st::gpu {

// out[i] = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), x = inp[i]. amax (device, optional) gets out's maximum
// folded in as kernels/gelu.h says, of the values as stored in T: the bits gpu::fp8_maxima_async (kernels/gpu/fp8.h)
// takes of out, non-finite values included, one atomicMax a block; the caller zeroes it first.
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n, const GpuContext& ctx, unsigned* amax = nullptr);

// Accumulates: dinp[i] += gelu'(inp[i]) * dout[i]. With write = kOverwrite, dinp[i] = gelu'(inp[i]) * dout[i],
// and dinp may be dout (in place).
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, const GpuContext& ctx,
                   GradWrite write = GradWrite::kAccumulate);

// out[i] = a[i] + b[i]. out may alias a or b.
template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n, const GpuContext& ctx);

}  // namespace st::gpu
