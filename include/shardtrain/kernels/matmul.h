// Dense layer on row-major matrices, weights in PyTorch nn.Linear layout [OC, C]. CPU fp32 reference
// through OpenBLAS sgemm.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/grad_write.h"

namespace st {

// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC].  bias may be null.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C, int OC);

// out[N,OC] = residual[N,OC] + inp[N,C] @ weight[OC,C]^T + bias[OC]: a linear layer that feeds a residual
// connection (the attention and MLP projections). bias may be null; out may be residual (in place).
void matmul_forward_residual(float* out, const float* inp, const float* weight, const float* bias,
                             const float* residual, int64_t N, int C, int OC);

// out[N,OC] = norm @ weight^T + bias, norm[N,C] the rows of inp through RMSNorm (rmsnorm_forward, which writes norm
// and rstd[N]): a pre-norm block's norm and the projection that reads it, as a decoding step runs them. bias may be
// null.
void rmsnorm_matmul_forward(float* out, float* norm, float* rstd, const float* inp, const float* norm_weight, float eps,
                            const float* weight, const float* bias, int64_t N, int C, int OC);

// out[N,OC] = residual + mlp @ weight^T + bias, mlp[N,F] the SwiGLU of gate_up[N, 2F] (swiglu_forward, which writes
// mlp): a SwiGLU block's down projection as a decoding step runs it. bias may be null; out may be residual.
void swiglu_matmul_forward_residual(float* out, float* mlp, const float* gate_up, const float* weight,
                                    const float* bias, const float* residual, int64_t N, int F, int OC);

// Accumulates: dinp[N,C] += dout @ weight; dweight[OC,C] += dout^T @ inp; dbias[OC] += sum_n dout[n,:].
// dinp, dweight and dbias may be null (not needed: a frozen weight / no bias). With dinp_write = kOverwrite, dinp =
// dout @ weight instead (dinp is not read); with param_write = kOverwrite, dweight and dbias are written the same way.
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int C, int OC, GradWrite dinp_write = GradWrite::kAccumulate,
                     GradWrite param_write = GradWrite::kAccumulate);

// The backward of out = gelu(pre_gelu) @ weight^T + bias, where inp = gelu(pre_gelu): dinp[N,C] =
// gelu'(pre_gelu) * (dout @ weight), overwritten; dweight and dbias as in matmul_backward (param_write). The
// reference for the GPU's fused version: matmul_backward (kOverwrite), then gelu_backward in place.
void matmul_backward_gelu(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* pre_gelu, int64_t N, int C, int OC,
                          GradWrite param_write = GradWrite::kAccumulate);

}  // namespace st
