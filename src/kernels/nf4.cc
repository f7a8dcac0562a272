#include "shardtrain/kernels/nf4.h"

#include <algorithm>
#include <cmath>

#include "shardtrain/core/error.h"

namespace st {

// QLoRA's NormalFloat4 levels as bitsandbytes ships them (float32).
const std::array<float, 16> kNf4Levels = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

Nf4Layout nf4_layout(int64_t n) {
  ST_CHECK(n >= 0, "nf4_layout: ", n, " weights");
  Nf4Layout l;
  l.absmax_offset = 0;
  l.absmax_scales = l.absmax_offset + static_cast<int64_t>(sizeof(float));
  l.codes = l.absmax_scales + static_cast<int64_t>(sizeof(float)) * nf4_groups(n);
  l.absmax_codes = l.codes + (n + 1) / 2;
  l.bytes = l.absmax_codes + nf4_blocks(n);
  return l;
}

int64_t nf4_bytes(int64_t n) { return nf4_layout(n).bytes; }

Nf4View nf4_view(uint8_t* buffer, int64_t n) {
  ST_CHECK(reinterpret_cast<uintptr_t>(buffer) % alignof(float) == 0, "nf4_view: buffer ",
           static_cast<const void*>(buffer), " is not 4-byte aligned");
  const Nf4Layout l = nf4_layout(n);
  return {n, buffer + l.codes, reinterpret_cast<int8_t*>(buffer + l.absmax_codes),
          reinterpret_cast<float*>(buffer + l.absmax_scales), reinterpret_cast<float*>(buffer + l.absmax_offset)};
}

Nf4ConstView nf4_view(const uint8_t* buffer, int64_t n) { return nf4_view(const_cast<uint8_t*>(buffer), n); }

Nf4View Nf4Quantized::view() { return {n, codes.data(), absmax_codes.data(), absmax_scales.data(), &absmax_offset}; }

Nf4ConstView Nf4Quantized::view() const {
  return {n, codes.data(), absmax_codes.data(), absmax_scales.data(), &absmax_offset};
}

int nf4_code(float scaled) { return nf4_nearest_code(scaled, kNf4Levels.data()); }

void nf4_refuse(const std::string& name, int64_t i, float value) {
  ST_BAD_INPUT(name, ": element ", i, " is ", value, "; NF4 quantises finite weights only");
}

void nf4_quantize(const float* x, int64_t n, Nf4View out, const std::string& name) {
  ST_CHECK(n >= 0 && out.n == n, "nf4_quantize: ", n, " weights into storage for ", out.n);
  const int64_t blocks = nf4_blocks(n), groups = nf4_groups(n);
  std::fill(out.codes, out.codes + (n + 1) / 2, uint8_t{0});
  std::vector<float> absmax(static_cast<size_t>(blocks), 0.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kNf4BlockSize, end = std::min(n, begin + kNf4BlockSize);
    float m = 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      if (!std::isfinite(x[i])) nf4_refuse(name, i, x[i]);
      m = std::max(m, std::fabs(x[i]));
    }
    absmax[static_cast<size_t>(b)] = m;
    for (int64_t i = begin; i < end; ++i) {
      const int code = m == 0.0f ? 7 : nf4_code(x[i] / m);
      out.codes[i / 2] |= static_cast<uint8_t>(i % 2 == 0 ? code << 4 : code);
    }
  }
  // Double quantisation of the absmaxes.
  double sum = 0.0;
  for (int64_t g = 0; g < groups; ++g) {
    double group_sum = 0.0;
    for (int64_t b = g * kNf4AbsmaxGroupSize; b < std::min(blocks, (g + 1) * kNf4AbsmaxGroupSize); ++b)
      group_sum += absmax[static_cast<size_t>(b)];
    sum += group_sum;
  }
  const float offset = blocks > 0 ? static_cast<float>(sum / static_cast<double>(blocks)) : 0.0f;
  *out.absmax_offset = offset;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * kNf4AbsmaxGroupSize, end = std::min(blocks, begin + kNf4AbsmaxGroupSize);
    float scale = 0.0f;
    for (int64_t b = begin; b < end; ++b) scale = std::max(scale, std::fabs(absmax[static_cast<size_t>(b)] - offset));
    out.absmax_scales[g] = scale;
    for (int64_t b = begin; b < end; ++b) {
      const float centred = absmax[static_cast<size_t>(b)] - offset;
      const float r = scale == 0.0f ? 0.0f : std::nearbyint((centred / scale) * 127.0f);  // half to even
      out.absmax_codes[b] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
  }
}

Nf4Quantized nf4_quantize(const float* x, int64_t n, const std::string& name) {
  ST_CHECK(n >= 0, "nf4_quantize: ", n, " weights");
  Nf4Quantized q;
  q.n = n;
  q.codes.resize(static_cast<size_t>((n + 1) / 2));
  q.absmax_codes.resize(static_cast<size_t>(nf4_blocks(n)));
  q.absmax_scales.resize(static_cast<size_t>(nf4_groups(n)));
  nf4_quantize(x, n, q.view(), name);
  return q;
}

float nf4_absmax(Nf4ConstView q, int64_t block) {
  const float scale = q.absmax_scales[block / kNf4AbsmaxGroupSize];
  return ((static_cast<float>(q.absmax_codes[block]) / 127.0f) * scale) + *q.absmax_offset;
}

void nf4_dequantize(Nf4ConstView q, float* out) {
  for (int64_t b = 0; b < nf4_blocks(q.n); ++b) {
    const float absmax = nf4_absmax(q, b);
    for (int64_t i = b * kNf4BlockSize; i < std::min(q.n, (b + 1) * kNf4BlockSize); ++i)
      out[i] = kNf4Levels[static_cast<size_t>(q.code(i))] * absmax;
  }
}

}  // namespace st
