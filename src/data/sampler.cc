#include "shardtrain/data/sampler.h"

#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/data/index_permutation.h"

namespace st {

Sampler::Sampler(const TokenSource& source, const SamplerOptions& options) : source_(source), options_(options) {
  ST_CHECK(options_.T > 0, "T = ", options_.T);
  ST_CHECK(options_.micro_batch > 0, "micro_batch = ", options_.micro_batch);
  ST_CHECK(options_.world > 0 && options_.rank >= 0 && options_.rank < options_.world, "rank ", options_.rank,
           " of world ", options_.world);
  ST_CHECK(options_.accum > 0, "accum = ", options_.accum);
  const int64_t need = static_cast<int64_t>(options_.T) + 1;
  if (source_.size() < need) {
    ST_BAD_INPUT("data ", source_.describe(), " holds ", source_.size(),
                 " tokens, fewer than one window of model.seq_len + 1 = ", need);
  }
  num_windows_ = (source_.size() - 1) / options_.T;
}

int64_t Sampler::global_index(int64_t step, int64_t micro_step, int64_t b) const {
  ST_CHECK(step >= 0 && micro_step >= 0 && micro_step < options_.accum && b >= 0 && b < options_.micro_batch, "step ",
           step, ", micro_step ", micro_step, " (accum ", options_.accum, "), b ", b, " (micro_batch ",
           options_.micro_batch, ")");
  return ((step * options_.accum + micro_step) * options_.world + options_.rank) * options_.micro_batch + b;
}

int64_t Sampler::window_of(int64_t g) const {
  ST_CHECK(g >= 0, "global sequence index ", g);
  const int64_t i = g % num_windows_;
  if (!options_.shuffle) return i;
  const uint64_t epoch = static_cast<uint64_t>(g / num_windows_);
  const IndexPermutation perm(static_cast<uint64_t>(num_windows_),
                              random_bits_at(options_.seed, kDataOrderStream, epoch));
  return static_cast<int64_t>(perm(static_cast<uint64_t>(i)));
}

int64_t Sampler::eval_window(int64_t batch, int64_t b) const {
  ST_CHECK(batch >= 0 && b >= 0 && b < options_.micro_batch, "eval batch ", batch, ", b ", b);
  return ((batch * options_.world + options_.rank) * options_.micro_batch + b) % num_windows_;
}

void Sampler::fill(int64_t step, int64_t micro_step, int32_t* inputs, int32_t* targets) const {
  std::vector<int64_t> windows(static_cast<size_t>(options_.micro_batch));
  for (int64_t b = 0; b < options_.micro_batch; ++b) windows[b] = window_of(global_index(step, micro_step, b));
  fill_windows(windows.data(), inputs, targets);
}

void Sampler::fill_eval(int64_t batch, int32_t* inputs, int32_t* targets) const {
  std::vector<int64_t> windows(static_cast<size_t>(options_.micro_batch));
  for (int64_t b = 0; b < options_.micro_batch; ++b) windows[b] = eval_window(batch, b);
  fill_windows(windows.data(), inputs, targets);
}

void Sampler::fill_windows(const int64_t* windows, int32_t* inputs, int32_t* targets) const {
  const int64_t T = options_.T;
  const bool masked = source_.has_loss_mask();
  std::vector<uint8_t> mask(masked ? static_cast<size_t>(T) : 0);
  for (int64_t b = 0; b < options_.micro_batch; ++b) {
    // Two reads of T tokens, offset by one, instead of one read of T+1 and a copy: no scratch buffer,
    // and the second read hits the pages the first just touched.
    source_.read(windows[b] * T, T, inputs + b * T);
    int32_t* tgt = targets + b * T;
    source_.read(windows[b] * T + 1, T, tgt);
    if (!masked) continue;
    source_.read_mask(windows[b] * T + 1, T, mask.data());
    for (int64_t t = 0; t < T; ++t)
      if (mask[static_cast<size_t>(t)] == 0) tgt[t] = kNoTarget;
  }
}

int64_t Sampler::window_targets(int64_t w) const {
  const int64_t T = options_.T;
  if (!source_.has_loss_mask()) return T;
  std::vector<uint8_t> mask(static_cast<size_t>(T));
  source_.read_mask(w * T + 1, T, mask.data());
  int64_t n = 0;
  for (uint8_t m : mask) n += m;
  return n;
}

int64_t Sampler::step_targets(int64_t step) const {
  ST_CHECK(step >= 0, "step ", step);
  const int64_t G = sequences_per_step();
  if (!source_.has_loss_mask()) return G * options_.T;
  int64_t n = 0;
  for (int64_t g = step * G; g < (step + 1) * G; ++g) n += window_targets(window_of(g));
  return n;
}

int64_t Sampler::eval_targets(int64_t batches) const {
  ST_CHECK(batches >= 0, "eval batches ", batches);
  const int64_t per_batch = options_.world * options_.micro_batch;
  if (!source_.has_loss_mask()) return batches * per_batch * options_.T;
  int64_t n = 0;
  // Rank r's sequence b of batch i reads window ((i * world + r) * micro_batch + b) mod W (eval_window): every
  // rank's sequences of batches [0, batches) are the indices [0, batches * world * micro_batch).
  for (int64_t k = 0; k < batches * per_batch; ++k) n += window_targets(k % num_windows_);
  return n;
}

}  // namespace st
