#include "shardtrain/kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "grad_check.h"
#include "maximum_check.h"

namespace st {
namespace {

using testing::max_rel_diff;
using testing::randn;

const double kPi = std::acos(-1.0);

// A config whose head dimension is hs (one query head of hs; NKV does not change the table).
ModelConfig head_config(int hs, float theta) {
  ModelConfig cfg;
  cfg.n_head = 1;
  cfg.n_embd = hs;
  cfg.rope_theta = theta;
  return cfg;
}

// Llama 3.1's scaling: factor 32 (Llama 3.2 1B/3B's), low 1, high 4, over 8192 original positions.
ModelConfig llama3_config(int hs) {
  ModelConfig cfg = head_config(hs, 500000.0f);
  cfg.rope_scaling = RopeScaling::kLlama3;
  cfg.rope_scaling_factor = 32.0f;
  cfg.rope_scaling_low_freq_factor = 1.0f;
  cfg.rope_scaling_high_freq_factor = 4.0f;
  cfg.rope_scaling_original_max_position = 8192;
  return cfg;
}

TEST(Rope, InvFreqWithoutScalingIsThetaPower) {
  const ModelConfig cfg = head_config(64, 10000.0f);
  const std::vector<double> inv = rope_inv_freq(cfg);
  ASSERT_EQ(inv.size(), 32u);
  EXPECT_EQ(inv[0], 1.0);
  for (int j = 0; j < 32; ++j) {
    const double want = std::pow(10000.0, -2.0 * j / 64);
    EXPECT_NEAR(inv[j], want, 1e-14 * want) << j;
  }
}

// Hugging Face's _compute_llama3_parameters (transformers/modeling_rope_utils.py), element by element:
//   wavelen = 2 pi / inv_freq
//   inv_freq_llama = where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
//   smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
//   smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
//   is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
//   inv_freq_llama = where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
// with hs = 128, theta = 500000: wavelengths from 2 pi to ~2.5e6, so all three bands occur (kept below 8192 / 4,
// divided by factor above 8192 / 1, interpolated between).
TEST(Rope, InvFreqMatchesHuggingFaceLlama3) {
  const ModelConfig cfg = llama3_config(128);
  const std::vector<double> got = rope_inv_freq(cfg);
  ASSERT_EQ(got.size(), 64u);
  const double factor = 32, low_freq_factor = 1, high_freq_factor = 4, old_context_len = 8192;
  const double low_freq_wavelen = old_context_len / low_freq_factor,
               high_freq_wavelen = old_context_len / high_freq_factor;
  int kept = 0, divided = 0, medium = 0;
  for (int j = 0; j < 64; ++j) {
    const double inv_freq = 1.0 / std::pow(500000.0, 2.0 * j / 128);
    const double wavelen = 2 * kPi / inv_freq;
    double inv_freq_llama = wavelen > low_freq_wavelen ? inv_freq / factor : inv_freq;
    const double smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    const double smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama;
    const bool is_medium_freq = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (is_medium_freq) inv_freq_llama = smoothed_inv_freq;
    if (is_medium_freq) {
      ++medium;
      // Strictly between the divided and the kept frequency.
      EXPECT_LT(got[j], inv_freq) << j;
      EXPECT_GT(got[j], inv_freq / factor) << j;
    } else if (wavelen > low_freq_wavelen) {
      ++divided;
    } else {
      ++kept;
    }
    EXPECT_NEAR(got[j], inv_freq_llama, 1e-14 * inv_freq_llama) << j;
  }
  // Bands as worked out by hand: wavelen_j = 2 pi 500000^(j/64) passes 2048 after j = 28 and 8192 after j = 34.
  EXPECT_EQ(kept, 29);
  EXPECT_EQ(medium, 6);
  EXPECT_EQ(divided, 29);
}

TEST(Rope, TableIsCosAndSinOfPositionTimesFrequency) {
  const ModelConfig cfg = llama3_config(16);
  const RopeTable t = rope_table(cfg, 40);
  const std::vector<double> inv = rope_inv_freq(cfg);
  ASSERT_EQ(t.half, 8);
  ASSERT_EQ(t.cos.size(), 40u * 8);
  for (int p = 0; p < 40; ++p) {
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(t.cos[p * 8 + j], static_cast<float>(std::cos(p * inv[j]))) << p << " " << j;
      EXPECT_EQ(t.sin[p * 8 + j], static_cast<float>(std::sin(p * inv[j]))) << p << " " << j;
    }
  }
  EXPECT_EQ(t.cos[3], 1.0f);  // position 0 does not turn
  EXPECT_EQ(t.sin[3], 0.0f);
}

struct Shape {
  int B, T, NH, NKV, hs;
};
// Multi-head (NKV = NH), grouped-query (NKV < NH) and multi-query (NKV = 1).
const Shape kShapes[] = {{2, 5, 4, 4, 8}, {2, 6, 8, 2, 16}, {1, 9, 6, 1, 4}, {3, 4, 3, 1, 2}};

int64_t width(const Shape& s) { return int64_t{s.NH + 2 * s.NKV} * s.hs; }

// The rotation from the definition in double, with the angles from rope_inv_freq (so the check covers the table's
// rounding): q and k heads turn by t * f_j (sign 1) or its negative (sign -1), v heads stay.
std::vector<double> naive_rotate(const std::vector<float>& qkv, const Shape& s, const ModelConfig& cfg, int sign) {
  const std::vector<double> inv = rope_inv_freq(cfg);
  const int half = s.hs / 2;
  std::vector<double> out(qkv.begin(), qkv.end());
  for (int64_t r = 0; r < int64_t{s.B} * s.T; ++r) {
    const int64_t t = r % s.T;
    for (int h = 0; h < s.NH + s.NKV; ++h) {
      const int64_t base = r * width(s) + int64_t{h} * s.hs;
      for (int j = 0; j < half; ++j) {
        const double a = qkv[base + j], b = qkv[base + j + half], angle = sign * t * inv[j];
        out[base + j] = a * std::cos(angle) - b * std::sin(angle);
        out[base + j + half] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }
  return out;
}

ModelConfig shape_config(const Shape& s) {
  ModelConfig cfg = llama3_config(s.hs);
  // Short, so that the scaling changes these short heads' frequencies (the first in the interpolated band, the
  // others divided).
  cfg.rope_scaling_original_max_position = 16;
  cfg.n_head = s.NH;
  cfg.n_kv_head = s.NKV;
  cfg.n_embd = s.NH * s.hs;
  return cfg;
}

// The value heads of every row: [rows, NKV * hs].
template <typename V>
std::vector<double> value_heads(const std::vector<V>& qkv, const Shape& s) {
  const int64_t v0 = int64_t{s.NH + s.NKV} * s.hs;
  std::vector<double> v;
  for (int64_t r = 0; r < int64_t{s.B} * s.T; ++r)
    v.insert(v.end(), qkv.begin() + r * width(s) + v0, qkv.begin() + (r + 1) * width(s));
  return v;
}

TEST(Rope, ForwardAndBackwardMatchDefinitionInDouble) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "NH=" << s.NH << " NKV=" << s.NKV << " hs=" << s.hs);
    const ModelConfig cfg = shape_config(s);
    const RopeTable table = rope_table(cfg, s.T);
    const std::vector<float> x = randn(int64_t{s.B} * s.T * width(s), 300);
    std::vector<float> fwd = x, bwd = x;
    rope_forward(fwd.data(), table.cos.data(), table.sin.data(), s.B, s.T, s.NH, s.NKV, s.hs);
    rope_backward(bwd.data(), table.cos.data(), table.sin.data(), s.B, s.T, s.NH, s.NKV, s.hs);
    EXPECT_LE(max_rel_diff(fwd, naive_rotate(x, s, cfg, 1)), testing::kRefTol);
    EXPECT_LE(max_rel_diff(bwd, naive_rotate(x, s, cfg, -1)), testing::kRefTol);
    // Value heads untouched, bit for bit.
    EXPECT_EQ(value_heads(fwd, s), value_heads(x, s));
    EXPECT_EQ(value_heads(bwd, s), value_heads(x, s));
    // Something turned: position 1 on.
    EXPECT_GT(max_rel_diff(fwd, testing::to_double(x)), 1e-2);
  }
}

// The backward is the transpose of the forward: <forward(x), y> = <x, backward(y)>, and, the rotation being
// orthogonal, backward(forward(x)) = x. Both to the float rounding of a few products (|cos|, |sin| <= 1): 1e-6.
TEST(Rope, BackwardIsTransposeOfForward) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "NH=" << s.NH << " NKV=" << s.NKV << " hs=" << s.hs);
    const RopeTable table = rope_table(shape_config(s), s.T);
    const int64_t n = int64_t{s.B} * s.T * width(s);
    const std::vector<float> x = randn(n, 310), y = randn(n, 311);
    std::vector<float> fx = x, by = y;
    rope_forward(fx.data(), table.cos.data(), table.sin.data(), s.B, s.T, s.NH, s.NKV, s.hs);
    rope_backward(by.data(), table.cos.data(), table.sin.data(), s.B, s.T, s.NH, s.NKV, s.hs);
    double lhs = 0, rhs = 0, scale = 0;
    for (int64_t i = 0; i < n; ++i) {
      lhs += static_cast<double>(fx[i]) * y[i];
      rhs += static_cast<double>(x[i]) * by[i];
      scale += std::fabs(static_cast<double>(x[i]) * y[i]);
    }
    EXPECT_LE(std::fabs(lhs - rhs), 1e-6 * scale);

    std::vector<float> back = fx;
    rope_backward(back.data(), table.cos.data(), table.sin.data(), s.B, s.T, s.NH, s.NKV, s.hs);
    EXPECT_LE(max_rel_diff(back, testing::to_double(x)), 1e-6);
  }
}

// The backward's amax: the tensorwise maximum fp8_maxima takes of the whole of dqkv after the rotation, the value
// heads (which it does not rotate) included: here a value head holds the largest magnitude, then a rotated one does.
// The rotation keeps the bits of a run without it.
TEST(Rope, BackwardAmaxIsTheMaximumOfTheWholeGradient) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "NH=" << s.NH << " NKV=" << s.NKV << " hs=" << s.hs);
    const RopeTable table = rope_table(shape_config(s), s.T);
    std::vector<float> x = randn(int64_t{s.B} * s.T * width(s), 330);
    const int64_t last_value = width(s) - 1, first_query = width(s);  // row 0's last value head, row 1's first query
    for (const int64_t at : {last_value, first_query}) {
      x[at] = at == last_value ? -50.0f : 60.0f;
      std::vector<float> plain = x, got = x;
      rope_backward(plain.data(), table.cos.data(), table.sin.data(), s.B, s.T, s.NH, s.NKV, s.hs);
      unsigned amax = 0;
      rope_backward(got.data(), table.cos.data(), table.sin.data(), s.B, s.T, s.NH, s.NKV, s.hs, &amax);
      EXPECT_EQ(0, std::memcmp(got.data(), plain.data(), got.size() * sizeof(float)));
      EXPECT_EQ(amax, testing::tensor_maximum(got));
      if (at == last_value) EXPECT_EQ(amax, testing::maximum_bits(50.0f));
    }
  }
}

TEST(Rope, DeterministicAcrossThreadCounts) {
  // Above the size below which the kernels stay serial.
  const Shape s{4, 64, 8, 2, 16};
  const RopeTable table = rope_table(shape_config(s), s.T);
  const std::vector<float> x = randn(int64_t{s.B} * s.T * width(s), 320);
  testing::expect_same_bits_across_thread_counts([&] {
    std::vector<float> g = x;
    rope_forward(g.data(), table.cos.data(), table.sin.data(), s.B, s.T, s.NH, s.NKV, s.hs);
    rope_backward(g.data(), table.cos.data(), table.sin.data(), s.B, s.T, s.NH, s.NKV, s.hs);
    return g;
  });
}

}  // namespace
}  // namespace st
