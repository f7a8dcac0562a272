// The shapes the memory plans' tests work their numbers out from. GPT-2 124M's unit sizes (llm.c's layout: 124,475,904
// parameters; unit 0 = wte + wpe 39,419,904; each block 7,087,872; the final LayerNorm 1,536), which the memory plans'
// tests work their numbers out from.
#pragma once

#include <cstdint>

#include "shardtrain/core/config.h"

namespace st::plan_test {

inline constexpr int64_t kParams = 124475904;
inline constexpr int64_t kEmbedding = 39419904;
inline constexpr int64_t kBlock = 7087872;
inline constexpr int64_t kGiB = int64_t{1} << 30;

inline Config gpt2_124m(DType dtype) {
  Config c;
  c.model.n_layer = 12;
  c.model.n_head = 12;
  c.model.n_embd = 768;
  c.model.vocab_size = 50257;
  c.model.seq_len = 1024;
  c.train.device = Device::kCuda;
  c.train.dtype = dtype;
  return c;
}

// Llama-3.2-1B on cuda in bf16 (16 layers, 2048 channels, 32 query and 8 key/value heads of 64, SwiGLU 8192,
// vocabulary 128256, tied head, 2048 positions): a decoder's key/value cache is 64 MiB a sequence.
inline Config llama_1b() {
  Config c;
  c.model.arch = ModelArch::kLlama;
  c.model.n_layer = 16;
  c.model.n_head = 32;
  c.model.n_kv_head = 8;
  c.model.n_embd = 2048;
  c.model.ffn_dim = 8192;
  c.model.vocab_size = 128256;
  c.model.seq_len = 2048;
  c.model.tie_embeddings = true;
  c.train.device = Device::kCuda;
  c.train.dtype = DType::kBF16;
  return c;
}

}  // namespace st::plan_test
