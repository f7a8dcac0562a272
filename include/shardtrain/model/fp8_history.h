// The amax history of train.fp8=delayed (Transformer Engine's delayed scaling): a cast scales its operand by the
// largest maximum the same operand of the same layer had over the last `length` applied steps, instead of by its own
// maximum, so that the kernel writing the operand needs no pass over it first. Each cast still takes its own maximum
// and records it; at the step's end the step's maxima (the largest over its micro-steps and, by the caller, over every
// rank) become the newest entry, or are dropped when the step was skipped.
//
// A site is a block's linear layer (fp8_site_index, model/fp8_policy.h); each has three operands, x, W and dy
// (Fp8OperandIndex below), each with one maximum a tensor. The first step, with an empty history, scales by each
// operand's own maximum, as train.fp8=tensorwise does; so does an operand whose history holds only zeros, and one whose
// own maximum is not finite (its cast turns NaN and the step is skipped, as under tensorwise). Maxima are held as
// fp8_maxima writes them (the bits of the float), and every change goes through kernels/fp8_history.h, whose CUDA
// forms keep the same history on the device (model/cuda_fp8_history.h).
//
//   Fp8AmaxHistory h(sites, 16);
//   const unsigned m = h.pick(fp8_history_index(site, kFp8X), own, /*record=*/true);  // what the cast scales by
//   ... at the step's end: the step_maxima() of every rank reduced (fp8_max_over_ranks), then h.push(reduced), or
//   h.drop() for a skipped step
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace st {

// The operands of a site, in the order of their maxima in every entry: site * kFp8Operands + operand.
enum Fp8OperandIndex : int { kFp8X = 0, kFp8W = 1, kFp8Dy = 2 };
constexpr int kFp8Operands = 3;
inline int64_t fp8_history_index(int64_t site, int operand) { return site * kFp8Operands + operand; }

class Fp8AmaxHistory {
 public:
  Fp8AmaxHistory() = default;
  // sites >= 0; length in [1, 1024] (train.fp8_amax_history).
  Fp8AmaxHistory(int64_t sites, int length);

  int64_t sites() const { return sites_; }
  int length() const { return length_; }
  // How many applied steps the history holds (at most length()).
  int filled() const { return filled_; }
  // Maxima an entry holds: sites() * kFp8Operands.
  int64_t entry_size() const { return sites_ * kFp8Operands; }

  // The maximum the cast of operand `index` (fp8_history_index) scales by, given its own (fp8_maxima's bits): the
  // largest over the history, or `own` while that is 0 (fp8_delayed_maxima). With record, `own` is folded into the
  // step's maxima.
  unsigned pick(int64_t index, unsigned own, bool record);
  // The largest maximum over the history of operand `index`, as a float (0 when the history is empty).
  float scale_max(int64_t index) const;
  // The step's maxima so far (bits), entry_size() of them, for the caller's reduction over ranks.
  std::vector<unsigned>& step_maxima() { return step_; }

  // `entry` (entry_size() maxima: the step's, reduced over ranks; it may be step_maxima()) becomes the newest entry,
  // the oldest going once length() are held; the step's maxima restart from 0.
  void push(const std::vector<unsigned>& entry);
  // A skipped step: its maxima are dropped.
  void drop();

  // The entries, newest first, each entry_size() maxima as floats: what a checkpoint keeps.
  std::vector<std::vector<float>> entries() const;
  // Replaces the history with `entries` (newest first, any number; the newest length() are kept); each must hold
  // entry_size() maxima. The step's maxima restart from 0.
  void load(const std::vector<std::vector<float>>& entries);

 private:
  int64_t sites_ = 0;
  int length_ = 1;
  int filled_ = 0;
  int newest_ = -1;             // the ring slot of the newest entry
  std::vector<unsigned> ring_;  // length_ entries of entry_size()
  std::vector<unsigned> step_, history_max_;
};

}  // namespace st
