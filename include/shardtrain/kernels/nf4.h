// NormalFloat4 (NF4), QLoRA's 4-bit storage for frozen base weights (Dettmers et al., 2023): each block of 64 weights
// keeps its absolute maximum, and each weight the nearest of 16 levels (quantiles of a standard normal, scaled to
// [-1, 1], with an exact 0) to weight / absmax. Double quantisation then stores the absmaxes in 8 bits: the mean of
// all of them is subtracted, and each block of 256 centred absmaxes is scaled by its largest magnitude and rounded
// to a signed 8-bit integer (-127..127). Per weight: 4 bits of code, 8/64 bits of absmax, 32/(64*256) of scale.
//
//   const Nf4Quantized q = nf4_quantize(w.data(), n, "layers.3.mlp.up.weight");
//   nf4_dequantize(q.view(), back.data());          // back[i] = level(code[i]) * absmax(block of i)
//
// Every step is float32 arithmetic in a fixed order, without fused multiply-add, so that another implementation of
// the same steps (the GPU's, kernels/gpu/nf4.h; the tests' NumPy one) gives identical codes:
//   absmax_b  = max |x_i| over block b (the last block may be short)
//   code_i    = the level nearest to x_i / absmax_b (IEEE division; ties to the lower level); 0.0's code when
//               absmax_b = 0
//   offset    = (sum over groups of 256 blocks, in order, of the group's absmaxes summed in order, in double) / blocks,
//               rounded to float
//   c_b       = absmax_b - offset; scale_g = max |c_b| over the group; q_b = round-half-even((c_b / scale_g) * 127),
//               0 when scale_g = 0
//   dequantised absmax_b = ((q_b / 127) * scale_g) + offset; x_i ~ level(code_i) * that
// Non-finite weights are refused (kBadInput naming the tensor and the element).
//
// The storage is reached through a view (Nf4View, or Nf4ConstView to read), four pointers that may point into host
// or device memory: an Nf4Quantized's own arrays, or the sections of one contiguous buffer of nf4_bytes(n) bytes
// (nf4_layout), in which a tensor's NF4 storage can travel between ranks as bytes.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/host_device.h"

namespace st {

inline constexpr int64_t kNf4BlockSize = 64;         // weights per absmax
inline constexpr int64_t kNf4AbsmaxGroupSize = 256;  // absmaxes per fp32 scale

// The 16 levels, in code order (code 7 is 0.0).
extern const std::array<float, 16> kNf4Levels;

// Blocks of kNf4BlockSize weights (one absmax each) and groups of kNf4AbsmaxGroupSize blocks (one scale each) for n
// weights; the last of each may be short.
ST_HOST_DEVICE constexpr int64_t nf4_blocks(int64_t n) { return (n + kNf4BlockSize - 1) / kNf4BlockSize; }
ST_HOST_DEVICE constexpr int64_t nf4_groups(int64_t n) {
  return (nf4_blocks(n) + kNf4AbsmaxGroupSize - 1) / kNf4AbsmaxGroupSize;
}

// Read-only NF4 storage of n weights; it owns nothing. All four pointers are into host memory or all into device
// memory; absmax_offset points at one float.
struct Nf4ConstView {
  int64_t n = 0;
  const uint8_t* codes = nullptr;        // ceil(n / 2) bytes: weight 2i in the high nibble, 2i + 1 in the low one
  const int8_t* absmax_codes = nullptr;  // nf4_blocks(n)
  const float* absmax_scales = nullptr;  // nf4_groups(n)
  const float* absmax_offset = nullptr;  // 1: the mean of the blocks' absmaxes
  ST_HOST_DEVICE int code(int64_t i) const { return i % 2 == 0 ? codes[i / 2] >> 4 : codes[i / 2] & 15; }
};

// The same, writable (what the quantisers fill). Converts to Nf4ConstView.
struct Nf4View {
  int64_t n = 0;
  uint8_t* codes = nullptr;
  int8_t* absmax_codes = nullptr;
  float* absmax_scales = nullptr;
  float* absmax_offset = nullptr;
  ST_HOST_DEVICE operator Nf4ConstView() const {  // NOLINT(google-explicit-constructor): as T* -> const T*
    return {n, codes, absmax_codes, absmax_scales, absmax_offset};
  }
};

// One tensor's NF4 storage in one buffer of nf4_bytes(n) bytes: byte offsets of the sections, which follow one
// another without gaps in this order:
//   absmax_offset  float                at 0
//   absmax_scales  float[groups]        at 4
//   codes          uint8[ceil(n / 2)]   at 4 + 4 groups
//   absmax_codes   int8[blocks]         at 4 + 4 groups + ceil(n / 2), up to bytes = nf4_bytes(n)
// The floats come first, so a 4-byte aligned buffer aligns them, and the codes then start 4-byte aligned too (the
// GPU dequantisation reads them four bytes at a time). Little-endian floats, as the host and the GPU store them.
struct Nf4Layout {
  int64_t absmax_offset = 0, absmax_scales = 0, codes = 0, absmax_codes = 0, bytes = 0;
};
Nf4Layout nf4_layout(int64_t n);

// Storage bytes of n weights in NF4 with double quantisation (nf4_layout(n).bytes).
int64_t nf4_bytes(int64_t n);

// The view of the NF4 storage of n weights laid out by nf4_layout in `buffer` (nf4_bytes(n) bytes, host or device,
// 4-byte aligned; kInternal otherwise). Pointer arithmetic only: nothing is read.
Nf4View nf4_view(uint8_t* buffer, int64_t n);
Nf4ConstView nf4_view(const uint8_t* buffer, int64_t n);

// NF4 storage in host vectors, one per section.
struct Nf4Quantized {
  int64_t n = 0;                     // weights
  std::vector<uint8_t> codes;        // ceil(n / 2) bytes, as Nf4ConstView::codes
  std::vector<int8_t> absmax_codes;  // one per block of kNf4BlockSize weights
  std::vector<float> absmax_scales;  // one per group of kNf4AbsmaxGroupSize blocks
  float absmax_offset = 0.0f;        // the mean of the blocks' absmaxes
  // Views of this object's arrays, valid until it is resized, moved or destroyed.
  Nf4View view();
  Nf4ConstView view() const;
};

// The code of the level nearest to `scaled` in `levels` (16 ascending floats: kNf4Levels, or the GPU's copy of
// them), ties to the lower level. Subtraction and comparison only, so host and device agree without care.
ST_HOST_DEVICE inline int nf4_nearest_code(float scaled, const float* levels) {
  int best = 0;
  float best_distance = fabsf(scaled - levels[0]);
  for (int k = 1; k < 16; ++k) {
    const float d = fabsf(scaled - levels[k]);
    if (d < best_distance) best = k, best_distance = d;
  }
  return best;
}

// The code of the level nearest to `scaled` (a weight over its block's absmax), ties to the lower level.
int nf4_code(float scaled);

// Quantises x[0, n) into `out` (host storage for out.n == n weights), writing every byte of it. `name` names the
// tensor in the error for a non-finite weight (nf4_refuse).
void nf4_quantize(const float* x, int64_t n, Nf4View out, const std::string& name);
// The same into new storage.
Nf4Quantized nf4_quantize(const float* x, int64_t n, const std::string& name);

// Throws kBadInput: "<name>: element <i> is <value>; NF4 quantises finite weights only". Both quantisers refuse the
// first non-finite weight with it.
[[noreturn]] void nf4_refuse(const std::string& name, int64_t i, float value);

// Block b's absmax as dequantisation sees it (after double quantisation); host storage.
float nf4_absmax(Nf4ConstView q, int64_t block);

// out[i] = kNf4Levels[code_i] * nf4_absmax(q, i / kNf4BlockSize), for the q.n weights (host storage).
void nf4_dequantize(Nf4ConstView q, float* out);

}  // namespace st
