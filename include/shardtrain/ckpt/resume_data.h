// The data order a checkpoint was trained in, and whether a resuming run continues it.
//
// A run's order (data/sampler.h) is fixed by train.global_batch, data.shuffle, train.seed (shuffled data
// only) and the training data's window count; step s trains on global sequences [s*G, s*G + G). A resume
// continues at the checkpoint's step, so a run whose order differs silently skips or repeats data. The
// manifest records the order; a resume compares it with the run's and refuses a difference unless
// ckpt.allow_data_change is set, then says where the data continues.
//
//   DataOrder run{cfg.train.global_batch, cfg.train.seed, cfg.data.shuffle, sampler.num_windows()};
//   for (const std::string& line : check_data_order(saved, step, run, cfg.ckpt.allow_data_change, where))
//     ST_LOG_INFO(line);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace st {

struct DataOrder {
  int64_t global_batch = 0;   // train.global_batch: sequences a step
  uint64_t seed = 0;          // train.seed: the shuffled order's key
  bool shuffle = true;        // data.shuffle
  int64_t train_windows = 0;  // the training data's windows (Sampler::num_windows()); 0: not recorded
};

// Compares the order of the checkpoint `where` (`saved`, resumed at `step`) with this run's (`run`): global
// batch, shuffle, seed (when either order is shuffled) and, when the checkpoint records it, the window count.
// A difference without `allow_change` is kBadInput naming `where`, every differing key with the checkpoint's
// and this run's value, and ckpt.allow_data_change. Otherwise returns the lines to log: each allowed change,
// the global sequence (epoch, window) the run continues from, and what was skipped or will repeat; a
// checkpoint without a window count gets a note that a change of the data itself cannot be detected.
std::vector<std::string> check_data_order(const DataOrder& saved, int64_t step, const DataOrder& run, bool allow_change,
                                          const std::string& where);

}  // namespace st
