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

// Adapter dropout (PEFT's lora_dropout): element (n, c) of an adapter's input x [N, in] is kept with probability 1 - p
// and then scaled by 1 / (1 - p). Whether it is kept is a pure function of the key and the element's place in the
// global batch: row n is position n % rows_per_sequence of sequence first_sequence + n / rows_per_sequence, and
//   keep = u >= p,   u = (random_bits_at(seed, stream, (sequence * seq_stride + position) * in + c) >> 40) * 2^-24
// (core/rng.h), so every world size, micro-batch split and recompute draws the same mask.
struct LoraDropoutKey {
  float p = 0.0f;
  uint64_t seed = 0;
  uint64_t stream = 0;  // the layer and the adapter (lora_dropout_stream)
  int64_t first_sequence = 0;
  int64_t rows_per_sequence = 1;  // the micro-batch's active length
  int64_t seq_stride = 1;         // model.seq_len
};

// The stream of `layer`'s adapter on the family's linear layer `linear` (its index in lora_linears).
inline uint64_t lora_dropout_stream(int layer, int linear) {
  return 0x10DA0000ull + static_cast<uint64_t>(layer) * 16 + static_cast<uint64_t>(linear);
}

// out[n, c] = keep(n, c) ? x[n, c] / (1 - p) : 0.
void lora_dropout(float* out, const float* x, int64_t N, int in, const LoraDropoutKey& key);
// The backward of an adapter whose input went through lora_dropout, for x's gradient: dxd[N, in] = dh[N, r] A[r, in]
// (scratch, overwritten), then dx[n, c] += keep(n, c) ? dxd[n, c] / (1 - p) : 0. (lora_backward with dx null and
// the dropped input as x gives dA and dB.)
void lora_dropout_backward(float* dx, float* dxd, const float* dh, const float* A, int64_t N, int in, int r,
                           const LoraDropoutKey& key);

}  // namespace st
