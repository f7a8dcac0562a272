#include "shardtrain/kernels/rope.h"

#include <cmath>

#include "parallel.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/fp8.h"

namespace st {

using kernels_internal::kMinParallelWork;

std::vector<double> rope_inv_freq(const ModelConfig& cfg) {
  const int hs = cfg.head_dim();
  ST_CHECK(hs % 2 == 0, "RoPE needs an even head dimension, got ", hs);
  std::vector<double> inv(static_cast<size_t>(hs / 2));
  for (int j = 0; j < hs / 2; ++j) inv[j] = 1.0 / std::pow(static_cast<double>(cfg.rope_theta), 2.0 * j / hs);
  if (cfg.rope_scaling == RopeScaling::kLlama3) {
    // Hugging Face's _compute_llama3_parameters.
    const double factor = cfg.rope_scaling_factor, low = cfg.rope_scaling_low_freq_factor,
                 high = cfg.rope_scaling_high_freq_factor, old_len = cfg.rope_scaling_original_max_position;
    const double low_wavelen = old_len / low, high_wavelen = old_len / high;
    const double pi = std::acos(-1.0);
    for (double& f : inv) {
      const double wavelen = 2 * pi / f;
      if (wavelen > low_wavelen) {
        f /= factor;
      } else if (wavelen >= high_wavelen) {  // the band between: interpolate between scaled and unscaled
        const double smooth = (old_len / wavelen - low) / (high - low);
        f = (1 - smooth) * f / factor + smooth * f;
      }
    }
  }
  return inv;
}

RopeTable rope_table(const ModelConfig& cfg, int64_t positions) {
  RopeTable t;
  t.positions = positions;
  t.half = cfg.head_dim() / 2;
  const std::vector<double> inv = rope_inv_freq(cfg);
  t.cos.resize(static_cast<size_t>(positions * t.half));
  t.sin.resize(t.cos.size());
  for (int64_t p = 0; p < positions; ++p) {
    for (int j = 0; j < t.half; ++j) {
      const double angle = static_cast<double>(p) * inv[j];
      t.cos[p * t.half + j] = static_cast<float>(std::cos(angle));
      t.sin[p * t.half + j] = static_cast<float>(std::sin(angle));
    }
  }
  return t;
}

namespace {

// Turns the first NH + NKV heads of every row by +angle (sign = 1) or -angle (sign = -1).
// positions: each row's own (null: row % T).
void rotate(float* qkv, const float* cos, const float* sin, int64_t B, int64_t T, int NH, int NKV, int hs, float sign,
            const int32_t* positions = nullptr) {
  const int half = hs / 2;
  const int64_t stride = static_cast<int64_t>(NH + 2 * NKV) * hs, rows = B * T;
  const int heads = NH + NKV;
#pragma omp parallel for schedule(static) if (rows * heads * hs >= kMinParallelWork)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = positions != nullptr ? positions[r] : r % T;
    if (t < 0) continue;  // an idle row of a decoding step
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (int h = 0; h < heads; ++h) {
      float* x = qkv + r * stride + static_cast<int64_t>(h) * hs;
      for (int j = 0; j < half; ++j) {
        const float a = x[j], b = x[j + half], sn = sign * s[j];
        x[j] = a * c[j] - b * sn;
        x[j + half] = b * c[j] + a * sn;
      }
    }
  }
}

}  // namespace

void rope_forward(float* qkv, const float* cos, const float* sin, int64_t B, int64_t T, int NH, int NKV, int hs) {
  rotate(qkv, cos, sin, B, T, NH, NKV, hs, 1.0f);
}

void rope_backward(float* dqkv, const float* cos, const float* sin, int64_t B, int64_t T, int NH, int NKV, int hs,
                   unsigned* amax) {
  rotate(dqkv, cos, sin, B, T, NH, NKV, hs, -1.0f);
  if (amax != nullptr) fp8_fold_maximum(dqkv, B * T * (NH + 2 * NKV) * hs, amax);
}

void rope_forward_at(float* qkv, const float* cos, const float* sin, const int32_t* positions, int64_t rows, int NH,
                     int NKV, int hs) {
  rotate(qkv, cos, sin, 1, rows, NH, NKV, hs, 1.0f, positions);
}

}  // namespace st
