// The low-rank update of a LoRA adapter (model/lora.h) on row-major fp32 matrices: the CPU reference, through
// OpenBLAS sgemm. The adapter adds to `rows` columns of a wider output (the row slice of a stacked weight that it
// adapts): out points at its first column, and ldo is the output's row pitch.
//
//   matmul_forward(qkv, x, w_qkv, nullptr, N, C, QKV);                    // the frozen base
//   lora_forward(qkv + k_row0, QKV, h_k, x, A_k, B_k, N, C, r, KV * D, scale);
#pragma once

#include <cstdint>

#include "shardtrain/kernels/grad_write.h"

namespace st {

// h[N, r] = x[N, in] A[r, in]^T (kept for the backward), then out[n, 0..rows) += scale * (h B[rows, r]^T)[n, :].
void lora_forward(float* out, int64_t ldo, float* h, const float* x, const float* A, const float* B, int64_t N, int in,
                  int r, int rows, float scale);

// With dout[n, 0..rows) the output's gradient (row pitch ldo):
//   dh[N, r] = scale * dout B          (scratch, overwritten)
//   dB[rows, r] += scale * dout^T h
//   dA[r, in] += dh^T x
//   dx[N, in] += dh A                   (dx may be null)
// With param_write = kOverwrite, dA and dB are written instead (not read; zero when N = 0); dx still accumulates.
void lora_backward(float* dx, float* dA, float* dB, float* dh, const float* dout, int64_t ldo, const float* x,
                   const float* h, const float* A, const float* B, int64_t N, int in, int r, int rows, float scale,
                   GradWrite param_write = GradWrite::kAccumulate);

}  // namespace st
