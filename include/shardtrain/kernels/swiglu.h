// The SwiGLU gate of Llama's MLP: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). The gate and up projections
// are one GEMM, so their output is one buffer: gate_up [N, 2F], each row F gate values then F up values.
// CPU fp32 reference.
//
// Each output feeds a linear layer (out the down projection, dgate_up the gate/up projection's backward): with `amax`
// not null, the tensor written gets its maximum folded into *amax as it is written (fp8_fold_maximum, kernels/fp8.h),
// what train.fp8 = tensorwise scales that layer's cast by.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/fp8.h"
#include "shardtrain/kernels/grad_write.h"

namespace st {

// out [N, F] = silu(gate_up[:, :F]) * gate_up[:, F:].
void swiglu_forward(float* out, const float* gate_up, int64_t N, int F, unsigned* amax = nullptr);

// swiglu_forward's out cast to FP8 as it is computed, with a maximum known ahead (train.fp8=delayed, whose history
// gives it: model/fp8_history.h), so that out itself is never stored: its codes with the scale fp8_scale(amax, f)
// (amax: *amax's bits as a float; tensorwise, not a power of two; 1 for a maximum of 0, Transformer Engine's scale of
// an operand that has been 0 throughout its history) in out's layout into q [N, F] and transposed into
// q_t [F, N] (either may be null), 1 / scale into *inverse_scale, and out's maximum folded into *own (may be null;
// fp8_fold_maximum). A non-finite element gets the NaN code (0x7f, either format), so that the GEMM reading it turns
// NaN as a tensorwise cast of it would; otherwise, for a maximum > 0, the codes are fp8_quantize_with_maxima's of out.
void swiglu_forward_fp8(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, const float* gate_up, int64_t N,
                        int F, Fp8Format f, const unsigned* amax);

// swiglu_backward's dgate_up (written, not added) cast to FP8 as it is computed, as swiglu_forward_fp8 casts out: its
// codes in dgate_up's layout into q [N, 2F] and transposed into q_t [2F, N] (either may be null), 1 / scale into
// *inverse_scale, and its maximum folded into *own (may be null). What the gate/up projection's backward reads of its
// output gradient under train.fp8=delayed, where dgate_up itself is then never stored.
void swiglu_backward_fp8(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, const float* dout,
                         const float* gate_up, int64_t N, int F, Fp8Format f, const unsigned* amax);

// dgate_up [N, 2F] = d(out)/d(gate_up) applied to dout [N, F]: d gate = dout * up * silu'(gate), d up = dout *
// silu(gate), with silu'(g) = s (1 + g (1 - s)), s = sigmoid(g). Written (kOverwrite, the default) or added (amax:
// of the sums).
void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t N, int F,
                     GradWrite write = GradWrite::kOverwrite, unsigned* amax = nullptr);

}  // namespace st
