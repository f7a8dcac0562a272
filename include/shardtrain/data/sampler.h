// Sampler: deterministic per-rank batches from a TokenSource.
//
// The order is a pure function of (seed, step, micro_step, rank, world, micro_batch, accum): there is no
// hidden state, so a checkpoint needs only the step (the "data cursor" is the global sequence counter
// step * sequences_per_step()), and any rank can compute any batch.
//
// DATA ORDER (this is the contract; tests/data/sampler_test.cc checks it literally)
//
//   Windows. With T = options.T and N = source.size(), window w (0 <= w < W) is the T+1 tokens
//     [w*T, w*T + T + 1), where W = num_windows() = (N - 1) / T. Adjacent windows share one boundary token
//     (the last target of w is the first input of w+1), as in llm.c; the tail of fewer than T+1 tokens
//     after the last window is never read.
//
//   Sequence b of rank r's micro-batch at (step, micro_step) has the global sequence index
//       g = ((step * accum + micro_step) * world + rank) * micro_batch + b,   0 <= b < micro_batch.
//     So each optimizer step consumes the G = accum * world * micro_batch consecutive indices
//     [step*G, step*G + G): micro-step by micro-step, rank by rank within a micro-step, and b within a rank.
//     Holding G fixed, the set and order of the global sequences of a step do not depend on world,
//     micro_batch or accum, only their split over ranks and micro-steps does.
//
//   g -> window:
//     shuffle = false:  window = g mod W            (front to back, wrapping to window 0 at each epoch end)
//     shuffle = true:   e = g / W (the epoch), i = g mod W,
//                       window = P_e(i), P_e = IndexPermutation(W, random_bits_at(seed, kDataOrderStream, e))
//                       (a fresh bijection of [0, W) per epoch: each window exactly once per epoch).
//
//   Inputs and targets of sequence b: inputs[b*T + t] = token[w*T + t], targets[b*T + t] = token[w*T + t + 1]
//     for 0 <= t < T: targets are the inputs shifted by one.
//
//   Loss masks: where the source has one (TokenSource::has_loss_mask) and mask[w*T + t + 1] == 0, targets[b*T + t]
//     is kNoTarget (-1) instead. THE CONVENTION, everywhere downstream (kernels, models, backends, StepEngine):
//     a target < 0 is not a target, as PyTorch's ignore_index: its position gets no loss and no gradient, and it is
//     not counted in the mean. step_targets() and eval_targets() count the targets of every rank, so that each rank
//     knows the normaliser of the mean without a collective.
//
//   Evaluation (fill_eval): batch i of a validation pass gives sequence b the window
//       ((i * world + rank) * micro_batch + b) mod W,
//     never shuffled, independent of seed, step and accum: every pass reads the same windows.
//
//   st::SamplerOptions o;
//   o.T = 64; o.micro_batch = 8; o.rank = r; o.world = 2; o.accum = 4; o.seed = 1337; o.shuffle = true;
//   st::Sampler s(*split.train, o);
//   s.fill(step, micro_step, inputs.data(), targets.data());   // each a [8 * 64] int32 buffer
#pragma once

#include <cstdint>

#include "shardtrain/data/token_source.h"

namespace st {

// The target of a position whose loss-mask byte is 0 (any target < 0 means the same).
inline constexpr int32_t kNoTarget = -1;

// The random_bits_at() stream the shuffled order draws its per-epoch keys from.
inline constexpr uint64_t kDataOrderStream = 0xDA7A0DE4DA7A0DE4ull;

struct SamplerOptions {
  int T = 0;                // tokens per sequence (model.seq_len), > 0
  int64_t micro_batch = 0;  // sequences per rank per micro-step, > 0
  int rank = 0;             // 0 <= rank < world
  int world = 1;            // data-parallel ranks, > 0
  int64_t accum = 1;        // micro-steps per optimizer step (gradient accumulation), > 0
  uint64_t seed = 0;        // train.seed; only the shuffled order uses it
  bool shuffle = true;      // data.shuffle: false is the sequential order above
};

class Sampler {
 public:
  // Does not own `source`, which must outlive the sampler. Throws kBadInput naming the source and the
  // numbers if it holds fewer than T + 1 tokens; invalid options are an internal error.
  Sampler(const TokenSource& source, const SamplerOptions& options);

  // Writes this rank's micro-batch for (step, micro_step) into inputs[micro_batch * T] and
  // targets[micro_batch * T] (row-major [b][t]). Needs step >= 0 and 0 <= micro_step < accum.
  void fill(int64_t step, int64_t micro_step, int32_t* inputs, int32_t* targets) const;

  // Writes this rank's micro-batch of validation batch `batch` (>= 0), same layout as fill().
  void fill_eval(int64_t batch, int32_t* inputs, int32_t* targets) const;

  // The number of targets (entries >= 0 of the targets fill() writes) in optimizer step `step` over every rank and
  // micro-step: the normaliser of the step's mean loss. Without a loss mask, sequences_per_step() * T. Reads the mask
  // bytes of the step's G windows (G * T bytes).
  int64_t step_targets(int64_t step) const;
  // The same over validation batches [0, batches) of every rank (fill_eval).
  int64_t eval_targets(int64_t batches) const;

  // The pieces of the order, exposed so the trainer can log or checkpoint them and tests can check them.
  int64_t num_windows() const { return num_windows_; }
  int64_t global_index(int64_t step, int64_t micro_step, int64_t b) const;
  int64_t window_of(int64_t g) const;  // g >= 0
  int64_t eval_window(int64_t batch, int64_t b) const;
  // G = accum * world * micro_batch; step s starts at global sequence s * G (the checkpoint's data cursor).
  int64_t sequences_per_step() const { return options_.accum * options_.world * options_.micro_batch; }
  const SamplerOptions& options() const { return options_; }

 private:
  void fill_windows(const int64_t* windows, int32_t* inputs, int32_t* targets) const;
  // The targets of window w: how many of its T mask bytes [w*T + 1, w*T + T + 1) are 1.
  int64_t window_targets(int64_t w) const;

  const TokenSource& source_;
  SamplerOptions options_;
  int64_t num_windows_;
};

}  // namespace st
