// Training fixtures shared by the checkpoint, sharding and backend tests: a tiny GPT-2 config, a fixed random
// corpus cut into each rank's micro-batches in the sampler's order, a training loop that records what the tests
// compare, and the relative error of a whole unit. Header-only.
//
//   Config c = st::testing::tiny_config();
//   st::testing::Trace t = st::testing::train(c, comm, /*seed=*/5, c.train.steps);   // collective
//   EXPECT_LE(st::testing::rel_norm_error(t.params[u], ref.params[u]), 1e-5);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/train/step_engine.h"

namespace st::testing {

// 2 layers, 2 heads, n_embd 16, vocabulary 50 (padded to 128 in memory), T = 8; one sequence a micro-step and 12
// a step, which 1, 2, 3, 4 and 6 ranks divide. Everything else is Config's default.
inline Config tiny_config() {
  Config c;
  c.model.n_layer = 2;
  c.model.n_embd = 16;
  c.model.n_head = 2;
  c.model.vocab_size = 50;
  c.model.seq_len = 8;
  c.train.micro_batch = 1;
  c.train.global_batch = 12;
  return c;
}

// Sequences first_seq .. first_seq + B - 1 of a fixed random corpus: position t of sequence s is token
// random_bits_at(seed, s, t) mod vocab_size, for t <= T. in[b * T + t] gets positions 0 .. T - 1 of sequence
// first_seq + b, tgt[b * T + t] positions 1 .. T (the next token).
inline void fill_sequences(const Config& c, uint64_t seed, int64_t first_seq, int64_t B, int32_t* in, int32_t* tgt) {
  const int64_t T = c.model.seq_len;
  const auto V = static_cast<uint64_t>(c.model.vocab_size);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t <= T; ++t) {
      const auto tok = static_cast<int32_t>(
          random_bits_at(seed, static_cast<uint64_t>(first_seq + b), static_cast<uint64_t>(t)) % V);
      if (t < T) in[b * T + t] = tok;
      if (t > 0) tgt[b * T + t - 1] = tok;
    }
}

// Rank `rank` of `world`'s micro-batches of 0-based step `step`, in the sampler's order: micro-step m holds the
// corpus's sequences ((step * accum + m) * world + rank) * B + b for b < B, where B = c.train.micro_batch and
// accum = c.grad_accum_steps(world). So every world size trains on the same sequences each step.
inline BatchFn corpus_batches(const Config& c, uint64_t seed, int64_t step, int world = 1, int rank = 0) {
  const int64_t accum = c.grad_accum_steps(world), B = c.train.micro_batch;
  return [c, seed, step, world, rank, accum, B](int64_t micro, int32_t* in, int32_t* tgt) {
    fill_sequences(c, seed, ((step * accum + micro) * world + rank) * B, B, in, tgt);
  };
}

// What a training run leaves behind, gathered in full on every rank.
struct Trace {
  std::vector<float> losses;               // per step
  std::vector<double> norms;               // per step: the gradient norm before clipping
  std::vector<std::vector<float>> grads0;  // per unit: the first step's gradients (train's record_grads only)
  std::vector<std::vector<float>> params;  // per unit: the parameters after the last step (train only)
};

// Steps [from, to) on e with corpus_batches(c, seed, step, ...) for this rank of comm, appending each step's loss
// and norm to *tr; with record_grads, the gradients of step `from` go to tr->grads0. Collective.
inline void train_steps(StepEngine& e, const Config& c, Communicator& comm, uint64_t seed, int64_t from, int64_t to,
                        Trace* tr, bool record_grads = false) {
  const int64_t accum = c.grad_accum_steps(comm.world_size());
  for (int64_t step = from; step < to; ++step) {
    const float loss = e.forward_backward(corpus_batches(c, seed, step, comm.world_size(), comm.rank()), accum, step);
    if (record_grads && step == from) tr->grads0 = e.gather_grads();
    const StepStats s = e.optimizer_step(step, loss);
    tr->losses.push_back(s.loss);
    tr->norms.push_back(s.grad_norm);
  }
}

// Steps [0, steps) on e (train_steps, appending to *tr), then a checkpoint of them into c.ckpt.dir: its step
// directory. Collective.
inline std::string train_and_save(StepEngine& e, const Config& c, Communicator& comm, uint64_t seed, int64_t steps,
                                  Trace* tr) {
  train_steps(e, c, comm, seed, 0, steps, tr);
  CheckpointState cs;
  cs.step = steps;
  cs.optimizer_updates = e.updates();
  return save_checkpoint(c, e.sharded(), cs, comm);
}

// A fresh StepEngine of c on comm, trained for steps 0 .. steps - 1 (train_steps), then its parameters. Collective.
inline Trace train(const Config& c, Communicator& comm, uint64_t seed, int64_t steps, bool record_grads = false) {
  StepEngine e(c, comm);
  Trace tr;
  train_steps(e, c, comm, seed, 0, steps, &tr, record_grads);
  tr.params = e.gather_params();
  return tr;
}

// ||got - want|| / ||want|| over a whole unit: the measure for gradients and parameters, whose single small
// elements are dominated by summation order and rounding. Infinite when the sizes differ.
inline double rel_norm_error(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return INFINITY;
  double d = 0, n = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d += std::pow(static_cast<double>(got[i]) - want[i], 2);
    n += std::pow(static_cast<double>(want[i]), 2);
  }
  return std::sqrt(d / std::max(n, 1e-300));
}

}  // namespace st::testing
