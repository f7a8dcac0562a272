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

// st::swiglu_forward_fp8 for T in {float, bf16}: out as swiglu_forward<T> would store it (rounded to T), cast with
// *amax's scale into q and q_t (device, either may be null) without being stored, 1 / scale into *inverse_scale, its
// maximum folded into *own (device, optional; the caller zeroes it). One read of gate_up gives both layouts' codes
// (64 x 64 tiles) where N and F are multiples of 8 and the pointers aligned; any shape otherwise. The codes are those
// gpu::fp8_quantize_pair_with_maxima_async (kernels/gpu/fp8.h) casts swiglu_forward<T>'s out to with *amax, where
// out is finite.
template <typename T>
void swiglu_forward_fp8(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, const T* gate_up, int64_t N,
                        int F, Fp8Format f, const unsigned* amax, const GpuContext& ctx);

// st::swiglu_backward_fp8 for T in {float, bf16}: dgate_up as swiglu_backward<T> would write it (kOverwrite, rounded
// to T) cast with *amax's scale into q [N, 2F] and q_t [2F, N] (device, either may be null) without being stored,
// 1 / scale into *inverse_scale, its maximum folded into *own (optional; the caller zeroes it). Tiles as
// swiglu_forward_fp8's (N and F multiples of 8, aligned pointers), any shape otherwise; the codes are those
// gpu::fp8_quantize_pair_with_maxima_async casts swiglu_backward<T>'s dgate_up to with *amax, where it is finite.
template <typename T>
void swiglu_backward_fp8(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, const T* dout, const T* gate_up,
                         int64_t N, int F, Fp8Format f, const unsigned* amax, const GpuContext& ctx);

// dgate_up [N, 2F] = the gradient of out applied to dout [N, F]; written (kOverwrite) or added. dgate_up may be
// gate_up itself (the gradient replaces the activation in place).
template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int F, const GpuContext& ctx,
                     GradWrite write = GradWrite::kOverwrite, unsigned* amax = nullptr);

}  // namespace st::gpu
