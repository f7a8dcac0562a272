// Dense layer on row-major matrices, weights in PyTorch nn.Linear layout [OC, C]. CPU fp32 reference
// through OpenBLAS sgemm.
#pragma once

#include <cstdint>

namespace st {

// out[N,OC] = inp[N,C] @ weight[OC,C]^T + bias[OC].  bias may be null.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int64_t N, int C, int OC);

// Accumulates: dinp[N,C] += dout @ weight; dweight[OC,C] += dout^T @ inp; dbias[OC] += sum_n dout[n,:].
// dinp and dbias may be null (not needed / no bias).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int64_t N, int C, int OC);

}  // namespace st
