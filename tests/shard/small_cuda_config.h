// The small model the CUDA backend's GPU tests train. Odd sizes on purpose: vocab 300 (padded to 384), 3 heads of 16,
// T = 24, two micro-batches of 3.
#pragma once

#include "shardtrain/core/config.h"

namespace st::testing {

inline Config small_config(Device device, DType dtype) {
  Config c;
  c.model.n_layer = 2;
  c.model.n_head = 3;
  c.model.n_embd = 48;
  c.model.vocab_size = 300;
  c.model.seq_len = 24;
  c.train.micro_batch = 3;
  c.train.global_batch = 6;
  c.train.steps = 8;
  c.optim.warmup_steps = 1;
  c.optim.lr = 1e-3f;
  c.optim.eps = 1e-6f;  // Adam turns fp32 noise in zero gradients into steps otherwise (parity_test.py)
  c.train.device = device;
  c.train.dtype = dtype;
  return c;
}

}  // namespace st::testing
