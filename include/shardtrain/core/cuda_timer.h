// Where a GPU step's time goes: CUDA events between named laps of work on a stream, summed per name.
// Off unless SHARDTRAIN_PROFILE_OPS=1 (the events cost a little), in which case `shardtrain train` prints
// the table at the end of the run.
//
//   OpTimer timer(/*enabled=*/true);
//   {
//     OpTimer::Laps lap = timer.laps(stream);
//     lap("fwd.ln1");  layernorm_forward(...);    // the time until the next lap is "fwd.ln1"'s
//     lap("fwd.qkv");  matmul_forward(...);
//   }                                             // the last lap ends with the scope
//   ... stream synchronised ...
//   timer.collect();                              // adds the finished laps' times
//   std::string table = timer.report(steps);
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/core/cuda.h"

namespace st {

class OpTimer {
 public:
  explicit OpTimer(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }

  // Laps on one stream; each call starts a region (ending the previous one), destruction ends the last.
  // `name` must outlive the timer (a string literal). No-ops when the timer is disabled.
  class Laps {
   public:
    Laps(OpTimer* t, cudaStream_t s) : t_(t), s_(s) {}
    Laps(Laps&& o) noexcept : t_(std::exchange(o.t_, nullptr)), s_(o.s_) {}
    Laps(const Laps&) = delete;
    Laps& operator=(const Laps&) = delete;
    ~Laps() {
      if (t_) t_->mark(nullptr, s_);
    }
    void operator()(const char* name) {
      if (t_) t_->mark(name, s_);
    }

   private:
    OpTimer* t_;
    cudaStream_t s_;
  };

  Laps laps(cudaStream_t stream) { return Laps(enabled_ && !paused_ ? this : nullptr, stream); }
  // While paused, new laps record nothing (CudaShardedModel pauses it for evaluation and sampling runs: the table is
  // the training steps').
  // Laps already recorded are still collected.
  void pause(bool paused) { paused_ = paused; }
  // Adds the elapsed time of every region recorded since the last call, waiting for each region's end.
  void collect() { collect_first(used_); }
  // How many marks are recorded and not yet collected: a point to collect up to.
  size_t recorded() const { return used_; }
  // Adds the regions among the first `n` uncollected marks (waiting for each one's end) and keeps the later marks,
  // whose work may still run on another stream, for a later collect.
  void collect_first(size_t n);
  // One line per name, largest first: ms per step, share of the timed total, calls per step.
  std::string report(int64_t steps) const;
  // Forgets the totals so far (the first step's cuBLASLt planning and first-touch costs, for example).
  void reset() { totals_.clear(); }

 private:
  struct Mark {
    const char* name = nullptr;  // the region that starts here; null: none (a gap follows)
    CudaEvent event{true};
  };
  void mark(const char* name, cudaStream_t s);

  bool enabled_;
  bool paused_ = false;
  std::vector<std::unique_ptr<Mark>> marks_;  // reused between collects
  size_t used_ = 0;
  std::map<std::string, std::pair<double, int64_t>> totals_;  // name -> (ms, calls)
};

}  // namespace st
