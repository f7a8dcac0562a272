// The shapes the memory plans' tests work their numbers out from: GPT-2 124M's unit sizes (llm.c's layout:
// 124,475,904 parameters; unit 0 = wte + wpe 39,419,904; each block 7,087,872; the final LayerNorm 1,536) and Llama
// shapes.
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

// A llama on cuda in bf16 with 32 query and 8 key/value heads (of n_embd / 32), a vocabulary of 128256 and 2048
// positions.
inline Config llama(int n_layer, int n_embd, int ffn_dim, bool tie_embeddings) {
  Config c;
  c.model.arch = ModelArch::kLlama;
  c.model.n_layer = n_layer;
  c.model.n_head = 32;
  c.model.n_kv_head = 8;
  c.model.n_embd = n_embd;
  c.model.ffn_dim = ffn_dim;
  c.model.vocab_size = 128256;
  c.model.seq_len = 2048;
  c.model.tie_embeddings = tie_embeddings;
  c.train.device = Device::kCuda;
  c.train.dtype = DType::kBF16;
  return c;
}

// Llama-3.2-1B (16 layers, 2048 channels, heads of 64, SwiGLU 8192, tied head): a decoder's key/value cache is 64 MiB
// a sequence.
inline Config llama_1b() { return llama(16, 2048, 8192, true); }

}  // namespace st::plan_test
