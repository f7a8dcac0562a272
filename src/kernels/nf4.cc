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

namespace {

int64_t blocks_of(int64_t n) { return (n + kNf4BlockSize - 1) / kNf4BlockSize; }
int64_t groups_of(int64_t blocks) { return (blocks + kNf4AbsmaxGroupSize - 1) / kNf4AbsmaxGroupSize; }

}  // namespace

int64_t nf4_bytes(int64_t n) {
  const int64_t blocks = blocks_of(n);
  return (n + 1) / 2 + blocks + 4 * groups_of(blocks) + 4;
}

int nf4_code(float scaled) {
  int best = 0;
  float best_distance = std::fabs(scaled - kNf4Levels[0]);
  for (int k = 1; k < 16; ++k) {
    const float d = std::fabs(scaled - kNf4Levels[static_cast<size_t>(k)]);
    if (d < best_distance) best = k, best_distance = d;
  }
  return best;
}

Nf4Quantized nf4_quantize(const float* x, int64_t n, const std::string& name) {
  ST_CHECK(n >= 0, "nf4_quantize: ", n, " weights");
  Nf4Quantized q;
  q.n = n;
  q.codes.assign(static_cast<size_t>((n + 1) / 2), 0);
  const int64_t blocks = blocks_of(n), groups = groups_of(blocks);
  std::vector<float> absmax(static_cast<size_t>(blocks), 0.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kNf4BlockSize, end = std::min(n, begin + kNf4BlockSize);
    float m = 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      if (!std::isfinite(x[i]))
        ST_BAD_INPUT(name, ": element ", i, " is ", x[i], "; NF4 quantises finite weights only");
      m = std::max(m, std::fabs(x[i]));
    }
    absmax[static_cast<size_t>(b)] = m;
    for (int64_t i = begin; i < end; ++i) {
      const int code = m == 0.0f ? 7 : nf4_code(x[i] / m);
      q.codes[static_cast<size_t>(i / 2)] |= static_cast<uint8_t>(i % 2 == 0 ? code << 4 : code);
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
  q.absmax_offset = blocks > 0 ? static_cast<float>(sum / static_cast<double>(blocks)) : 0.0f;
  q.absmax_codes.assign(static_cast<size_t>(blocks), 0);
  q.absmax_scales.assign(static_cast<size_t>(groups), 0.0f);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * kNf4AbsmaxGroupSize, end = std::min(blocks, begin + kNf4AbsmaxGroupSize);
    float scale = 0.0f;
    for (int64_t b = begin; b < end; ++b)
      scale = std::max(scale, std::fabs(absmax[static_cast<size_t>(b)] - q.absmax_offset));
    q.absmax_scales[static_cast<size_t>(g)] = scale;
    if (scale == 0.0f) continue;
    for (int64_t b = begin; b < end; ++b) {
      const float centred = absmax[static_cast<size_t>(b)] - q.absmax_offset;
      const float r = std::nearbyint((centred / scale) * 127.0f);  // the default rounding: half to even
      q.absmax_codes[static_cast<size_t>(b)] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
  }
  return q;
}

float nf4_absmax(const Nf4Quantized& q, int64_t block) {
  const float scale = q.absmax_scales[static_cast<size_t>(block / kNf4AbsmaxGroupSize)];
  return ((static_cast<float>(q.absmax_codes[static_cast<size_t>(block)]) / 127.0f) * scale) + q.absmax_offset;
}

void nf4_dequantize(const Nf4Quantized& q, float* out) {
  for (int64_t b = 0; b < blocks_of(q.n); ++b) {
    const float absmax = nf4_absmax(q, b);
    for (int64_t i = b * kNf4BlockSize; i < std::min(q.n, (b + 1) * kNf4BlockSize); ++i)
      out[i] = kNf4Levels[static_cast<size_t>(q.code(i))] * absmax;
  }
}

}  // namespace st
