// The decoder tests' models (tests/model/decoder_test.cc, cuda_decoder_gpu_test.cc): a tiny gpt2, a tiny llama with
// grouped-query attention, q/k/v biases, llama3 RoPE scaling and an untied head, and random weights for either.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/model/units.h"

namespace st::testing {

inline ModelConfig tiny_gpt2() {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.vocab_size = 300;  // padded to 384
  c.seq_len = 20;
  return c;
}

inline ModelConfig tiny_llama() {
  ModelConfig c = tiny_gpt2();
  c.arch = ModelArch::kLlama;
  c.n_kv_head = 2;
  c.ffn_dim = 48;
  c.qkv_bias = true;
  c.tie_embeddings = false;
  c.rope_theta = 500000.0f;
  c.rope_scaling = RopeScaling::kLlama3;
  c.rope_scaling_original_max_position = 8;  // shorter than seq_len: the scaling changes the angles used
  return c;
}

// Random weights far from initialisation, so that the logits spread over several units and no argmax is a near tie:
// matrices and embeddings N(0, 0.2) (the padding rows stay 0), norm weights 1 + N(0, 0.1), biases N(0, 0.1).
inline std::vector<std::vector<float>> random_weights(const ModelConfig& c, uint64_t seed) {
  std::vector<std::vector<float>> w;
  for (const UnitLayout& u : build_units(c)) {
    w.emplace_back(static_cast<size_t>(u.numel));
    init_unit_range(u, c, seed, 0, u.numel, w.back().data());
    for (const TensorSpec& t : u.tensors)
      for (int64_t i = t.offset; i < t.offset + t.numel; ++i) {
        float& x = w.back()[static_cast<size_t>(i)];
        const auto n =
            static_cast<float>(normal_at(seed + 1, static_cast<uint64_t>(u.index), static_cast<uint64_t>(i)));
        if (t.init == InitKind::kOnes)
          x = 1.0f + 0.1f * n;
        else if (t.init == InitKind::kZeros)
          x = 0.1f * n;
        else
          x *= 10.0f;
      }
  }
  return w;
}

}  // namespace st::testing
