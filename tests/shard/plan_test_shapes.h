// GPT-2 124M's unit sizes (llm.c's layout: 124,475,904 parameters; unit 0 = wte + wpe 39,419,904; each block
// 7,087,872; the final LayerNorm 1,536), which the memory plans' tests work their numbers out from.
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

}  // namespace st::plan_test
