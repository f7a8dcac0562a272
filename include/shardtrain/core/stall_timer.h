// How long one stream waited on events recorded by others: events before and after each wait. The stream reaches
// `before` when its earlier work is done and `after` when the awaited work is too, so after - before is the time the
// wait held the stream up. Reads nothing back until collect(), after the stream has synchronised.
//
//   StallTimer stalls;
//   stalls.wait(compute, gather_done);     // compute waits for the gather, timed
//   ... compute.synchronize(); stalls.collect();
//   double ms = stalls.take_ms();
#pragma once

#include <memory>
#include <vector>

#include "shardtrain/core/cuda.h"

namespace st {

class StallTimer {
 public:
  // Makes `stream` wait for `done`, between two timing events.
  void wait(cudaStream_t stream, const CudaEvent& done) {
    if (used_ == stalls_.size()) stalls_.push_back(std::make_unique<Stall>());
    Stall& s = *stalls_[used_++];
    s.before.record(stream);
    done.wait_on(stream);
    s.after.record(stream);
  }
  // Once the stream has synchronised: adds up the waits since the last call (their events are then reused).
  void collect() {
    for (size_t i = 0; i < used_; ++i) {
      float ms = 0;
      ST_CUDA_CHECK(cudaEventElapsedTime(&ms, stalls_[i]->before.get(), stalls_[i]->after.get()));
      ms_ += ms;
    }
    used_ = 0;
  }
  // Milliseconds collected since the last call.
  double take_ms() {
    const double ms = ms_;
    ms_ = 0;
    return ms;
  }

 private:
  struct Stall {
    CudaEvent before{true}, after{true};
  };
  std::vector<std::unique_ptr<Stall>> stalls_;  // grows to the most waits between two collect() calls
  size_t used_ = 0;
  double ms_ = 0;
};

}  // namespace st
