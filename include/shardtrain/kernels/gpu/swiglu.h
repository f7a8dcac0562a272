// SwiGLU on the GPU: the CUDA version of kernels/swiglu.h, same operands and meaning, for activations T in {float,
// bf16, fp16} (fp32 arithmetic). Device pointers, asynchronous on ctx.stream; no scratch. amax (device, optional)
// gets the maximum of the tensor written (out, dgate_up) folded in as kernels/swiglu.h says, of the values as stored
// in T: the bits gpu::fp8_maxima_async (kernels/gpu/fp8.h) takes of that tensor, non-finite values included, one
// atomicMax a block; the caller zeroes it first.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/swiglu.h"

namespace st::gpu {

// out [N, F] = silu(gate_up[:, :F]) * gate_up[:, F:].
template <typename T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int F, const GpuContext& ctx, unsigned* amax = nullptr);

// dgate_up [N, 2F] = the gradient of out applied to dout [N, F]; written (kOverwrite) or added. dgate_up may be
// gate_up itself (the gradient replaces the activation in place).
template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int F, const GpuContext& ctx,
                     GradWrite write = GradWrite::kOverwrite, unsigned* amax = nullptr);

}  // namespace st::gpu
