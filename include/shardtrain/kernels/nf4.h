// NormalFloat4 (NF4), QLoRA's 4-bit storage for frozen base weights (Dettmers et al., 2023): each block of 64 weights
// keeps its absolute maximum, and each weight the nearest of 16 levels (quantiles of a standard normal, scaled to
// [-1, 1], with an exact 0) to weight / absmax. Double quantisation then stores the absmaxes in 8 bits: the mean of
// all of them is subtracted, and each block of 256 centred absmaxes is scaled by its largest magnitude and rounded
// to a signed 8-bit integer (-127..127). Per weight: 4 bits of code, 8/64 bits of absmax, 32/(64*256) of scale.
//
//   const Nf4Quantized q = nf4_quantize(w.data(), n, "layers.3.mlp.up.weight");
//   nf4_dequantize(q, back.data());                 // back[i] = level(code[i]) * absmax(block of i)
//
// Every step is float32 arithmetic in a fixed order, without fused multiply-add, so that another implementation of
// the same steps (the GPU's, the tests' NumPy one) gives identical codes:
//   absmax_b  = max |x_i| over block b (the last block may be short)
//   code_i    = the level nearest to x_i / absmax_b (IEEE division; ties to the lower level); 0.0's code when
//               absmax_b = 0
//   offset    = (sum over groups of 256 blocks, in order, of the group's absmaxes summed in order, in double) / blocks,
//               rounded to float
//   c_b       = absmax_b - offset; scale_g = max |c_b| over the group; q_b = round-half-even((c_b / scale_g) * 127),
//               0 when scale_g = 0
//   dequantised absmax_b = ((q_b / 127) * scale_g) + offset; x_i ~ level(code_i) * that
// Non-finite weights are refused (kBadInput naming the tensor and the element).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace st {

inline constexpr int64_t kNf4BlockSize = 64;         // weights per absmax
inline constexpr int64_t kNf4AbsmaxGroupSize = 256;  // absmaxes per fp32 scale

// The 16 levels, in code order (code 7 is 0.0).
extern const std::array<float, 16> kNf4Levels;

struct Nf4Quantized {
  int64_t n = 0;                     // weights
  std::vector<uint8_t> codes;        // ceil(n / 2) bytes: weight 2i in the high nibble, 2i + 1 in the low one
  std::vector<int8_t> absmax_codes;  // one per block of kNf4BlockSize weights
  std::vector<float> absmax_scales;  // one per group of kNf4AbsmaxGroupSize blocks
  float absmax_offset = 0.0f;        // the mean of the blocks' absmaxes
  int code(int64_t i) const {
    return i % 2 == 0 ? codes[static_cast<size_t>(i / 2)] >> 4 : codes[static_cast<size_t>(i / 2)] & 15;
  }
};

// Storage bytes of n weights in NF4 with double quantisation.
int64_t nf4_bytes(int64_t n);

// The code of the level nearest to `scaled` (a weight over its block's absmax), ties to the lower level.
int nf4_code(float scaled);

// `name` names the tensor in the error for a non-finite weight.
Nf4Quantized nf4_quantize(const float* x, int64_t n, const std::string& name);

// Block b's absmax as dequantisation sees it (after double quantisation).
float nf4_absmax(const Nf4Quantized& q, int64_t block);

// out[i] = kNf4Levels[code_i] * nf4_absmax(q, i / kNf4BlockSize), for the q.n weights.
void nf4_dequantize(const Nf4Quantized& q, float* out);

}  // namespace st
