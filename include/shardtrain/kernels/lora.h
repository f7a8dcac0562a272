// The low-rank update of LoRA adapters (model/lora.h) on row-major fp32 matrices: the CPU reference, through
// OpenBLAS sgemm. The adapters of one weight that read one input run as a stack: their A matrices stacked into one
// [count * r, in] matrix and their B matrices into one [sum of rows, r] matrix, each adapter writing its own columns
// (its slice: the rows of a stacked weight it adapts) of a wider output of row pitch ldo. A stack of one is a lone
// adapter.
//
//   matmul_forward(qkv, x, w_qkv, nullptr, N, C, QKV);                    // the frozen base
//   const LoraStack qkv_stack{C, r, {{0, C}, {C, KV * D}, {C + KV * D, KV * D}}};   // q, k and v
//   lora_forward(qkv, QKV, GradWrite::kAccumulate, h, x, A_qkv, B_qkv, N, qkv_stack, scale);
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/kernels/grad_write.h"

namespace st {

// Adapter j of a stack writes output columns [row0, row0 + rows).
struct LoraSlice {
  int64_t row0 = 0, rows = 0;
};

struct LoraStack {
  int in = 0;  // the input's width
  int r = 0;   // each adapter's rank
  std::vector<LoraSlice> slices;
  int width() const { return r * static_cast<int>(slices.size()); }  // h's columns: count * r
  int64_t b_rows() const;                                            // B's rows: the slices' rows summed
};

// The shapes lora_forward and lora_backward take, on the CPU and the GPU alike (st::Error naming `what` otherwise):
// N >= 0, in and r > 0, at least one adapter, every slice inside the output's ldo columns.
void check_lora_stack(const char* what, int64_t N, int64_t ldo, const LoraStack& s);

// h[N, count * r] = x[N, in] A^T (kept for the backward); then for each adapter j, with h_j = h[:, j r .. (j + 1) r)
// and B_j its rows of B: out[n, row0_j + i] (+)= scale * (h_j B_j^T)[n, i]. out_write = kAccumulate adds to out,
// kOverwrite writes it (not read); columns outside the slices are untouched.
void lora_forward(float* out, int64_t ldo, GradWrite out_write, float* h, const float* x, const float* A,
                  const float* B, int64_t N, const LoraStack& s, float scale);

// With dout (row pitch ldo) the output's gradient and g_j = dout[:, row0_j .. row0_j + rows_j):
//   dh[N, count * r] = scale * [g_0 B_0 | g_1 B_1 | ...]   (scratch, overwritten)
//   dB_j (+)= scale * g_j^T h_j
//   dA (+)= dh^T x                                         ([count * r, in])
//   dx (+)= dh A                                           (dx may be null)
// param_write says whether dA and dB are added to or written (zero when N = 0); dx_write likewise for dx.
void lora_backward(float* dx, GradWrite dx_write, float* dA, float* dB, float* dh, const float* dout, int64_t ldo,
                   const float* x, const float* h, const float* A, const float* B, int64_t N, const LoraStack& s,
                   float scale, GradWrite param_write = GradWrite::kAccumulate);

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
