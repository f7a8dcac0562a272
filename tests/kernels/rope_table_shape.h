// The RoPE table of a llama attention shape, for the kernel tests of the decoding step on either device.
#pragma once

#include "shardtrain/core/config.h"
#include "shardtrain/kernels/rope.h"

namespace st::test {

// rope_table of a llama with NH query heads, NKV key/value heads of hs dimensions, over seq_len positions.
inline RopeTable llama_rope_table(int NH, int NKV, int hs, int seq_len) {
  ModelConfig cfg;
  cfg.arch = ModelArch::kLlama;
  cfg.n_head = NH;
  cfg.n_kv_head = NKV;
  cfg.n_embd = NH * hs;
  cfg.seq_len = seq_len;
  return rope_table(cfg, seq_len);
}

}  // namespace st::test
