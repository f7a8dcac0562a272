// The tiny model the FP8 tests train on both backends: every block dimension a multiple of 16, so that each linear
// layer takes FP8. With seq_len 16 (one sequence a micro-batch) the weight gradients do too (their GEMM's depth, the
// micro-batch's tokens, a multiple of 16); with 8 they stay in train.dtype.
#pragma once

#include <string>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/comm/communicator.h"
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

// A train.fp8=delayed engine of c (whose ckpt.dir names an empty folder) after `steps` steps, and a
// train.fp8=tensorwise engine that loaded its checkpoint: the same weights, which the one evaluates with its history
// at hand and the other with each tensor's own maximum. Their evaluation losses on held-out batches (another seed's).
struct DelayedEvaluation {
  float delayed = 0, tensorwise = 0;
};

inline DelayedEvaluation evaluate_delayed_and_tensorwise(const Config& c, uint64_t seed, int64_t steps) {
  SoloCommunicator solo;
  StepEngine delayed(c, solo);
  Trace t;
  const std::string where = train_and_save(delayed, c, solo, seed, steps, &t);
  Config tc = c;
  tc.train.fp8 = Fp8Recipe::kTensorwise;
  tc.train.fp8_amax_history = Config{}.train.fp8_amax_history;
  StepEngine tensorwise(tc, solo);
  load_checkpoint(where, tc, tensorwise.sharded(), solo);
  const BatchFn held_out = corpus_batches(c, seed + 100, 0);
  return {delayed.evaluate(held_out, 2), tensorwise.evaluate(held_out, 2)};
}

}  // namespace st::testing
