// Rotary position embedding (RoPE) as Hugging Face's Llama applies it (the rotate-half layout): within each head of
// hs values, element j < hs/2 pairs with element j + hs/2, and the pair at position t turns by the angle t * f_j.
// CPU fp32 reference.
//
//   const RopeTable rope = rope_table(cfg, T);      // cos and sin [T, hs/2], once per model
//   rope_forward(qkv, rope.cos.data(), rope.sin.data(), B, T, NH, NKV, hs);   // q and k heads, in place
//   ... attention forward and backward on the rotated q and k ...
//   rope_backward(dqkv, rope.cos.data(), rope.sin.data(), B, T, NH, NKV, hs); // d(rotated) -> d(unrotated)
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"

namespace st {

// The angles' cosines and sines, [T, hs/2] row-major, for positions 0..T-1. The frequencies are Hugging Face's:
// f_j = rope_theta^(-2j/hs), and with rope_scaling = llama3 the "llama3" rule (wavelengths above
// original_max_position / low_freq_factor divided by factor, below original_max_position / high_freq_factor kept,
// smoothly interpolated between). Computed in double and rounded once.
struct RopeTable {
  int64_t positions = 0;
  int half = 0;  // hs / 2
  std::vector<float> cos, sin;
};
RopeTable rope_table(const ModelConfig& cfg, int64_t positions);

// The inverse frequencies f_j, j < hs/2, in double (what rope_table turns by).
std::vector<double> rope_inv_freq(const ModelConfig& cfg);

// qkv [B,T,(NH+2 NKV) hs] as in attention.h: rotates the NH query heads and the NKV key heads of every row in place
// (values are untouched): x[j] <- x[j] cos - x[j+hs/2] sin, x[j+hs/2] <- x[j+hs/2] cos + x[j] sin, with the angle of
// the row's position t (rows are b-major: t = row % T). cos/sin [T, hs/2].
void rope_forward(float* qkv, const float* cos, const float* sin, int64_t B, int64_t T, int NH, int NKV, int hs);

// The backward: turns the gradient of the rotated q and k back by -angle, in place on dqkv (same layout). The
// rotation is orthogonal, so this is its transpose: d[j] <- d[j] cos + d[j+hs/2] sin, d[j+hs/2] <- d[j+hs/2] cos -
// d[j] sin. dqkv feeds the q/k/v projection's backward: with `amax` not null, the maximum of the whole of dqkv after
// the rotation (the value heads' gradient, which it leaves as it is, included) folds into *amax (fp8_fold_maximum,
// kernels/fp8.h), what train.fp8 = tensorwise scales that layer's cast of it by.
void rope_backward(float* dqkv, const float* cos, const float* sin, int64_t B, int64_t T, int NH, int NKV, int hs,
                   unsigned* amax = nullptr);

// rope_forward on `rows` rows [rows, (NH+2 NKV) hs], row r at position positions[r] (a row of cos/sin, which hold at
// least max(positions) + 1 rows): what a decoding step reads from memory rather than from its launch. A row at a
// negative position (idle) is left as it is.
void rope_forward_at(float* qkv, const float* cos, const float* sin, const int32_t* positions, int64_t rows, int NH,
                     int NKV, int hs);

}  // namespace st
