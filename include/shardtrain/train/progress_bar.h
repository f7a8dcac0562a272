// The progress bar `train` redraws on a terminal after every step (MetricsSink draws it; never written to a
// file or pipe). Its text is a pure function of the numbers below, so it is tested without a terminal.
//
//   ProgressState s{120, 600, 25.0, 20, 12345.0, 2.3456f};
//   progress_bar_text(s)  // "[######........................] 120/600 | ETA 10m00s | 12.3k tok/s | loss 2.3456"
#pragma once

#include <cstdint>
#include <string>

namespace st {

struct ProgressState {
  int64_t step = 0;          // steps completed (1-based, as in the metrics)
  int64_t total = 0;         // train.steps
  double elapsed_s = 0;      // wall time since this run's first step began (evaluation and checkpoints included)
  int64_t steps_done = 0;    // steps this run has completed in elapsed_s (fewer than `step` after a resume)
  double tokens_per_s = 0;   // throughput to show (the sink gives the mean over this run's steps)
  float loss = 0;            // the latest step's loss
};

// "[###...] STEP/TOTAL | ETA 1h05m | 583.2k tok/s | loss 2.1034": a 30-character bar filled in proportion to
// step / total; ETA = elapsed_s / steps_done x (total - step) ("ETA --" before any step is done); tok/s as is
// below 10,000, with k above and M above 10 million; a non-finite loss prints as "nan" or "inf".
std::string progress_bar_text(const ProgressState& s);

// "12m05s" below an hour, "1h05m" from an hour on; seconds are rounded.
std::string format_duration(double seconds);

}  // namespace st
