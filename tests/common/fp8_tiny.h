// The tiny model the FP8 tests train on both backends: every block dimension a multiple of 16, so that each linear
// layer takes FP8. With seq_len 16 (one sequence a micro-batch) the weight gradients do too (their GEMM's depth, the
// micro-batch's tokens, a multiple of 16); with 8 they stay in train.dtype.
#pragma once

#include "shardtrain/core/config.h"
#include "tiny_training.h"

namespace st::testing {

inline Config fp8_tiny(ModelArch arch, Fp8Recipe fp8, Device device = Device::kCpu, DType dtype = DType::kF32,
                       int64_t seq_len = 16) {
  Config c = tiny_config();
  c.model.seq_len = seq_len;
  c.train.steps = 4;
  c.optim.warmup_steps = 1;
  c.optim.lr = 1e-2f;  // the loss falls within the 4 steps, with and without FP8
  c.train.fp8 = fp8;
  c.train.device = device;
  c.train.dtype = dtype;
  if (arch == ModelArch::kLlama) {
    c.model.arch = arch;
    c.model.n_head = 4;
    c.model.n_kv_head = 2;
    c.model.ffn_dim = 48;
    c.model.tie_embeddings = false;
  }
  return c;
}

}  // namespace st::testing
