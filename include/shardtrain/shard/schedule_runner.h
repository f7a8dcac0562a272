// The one interpreter of a schedule (schedule.h), shared by every backend: it walks the ops in order, checks that
// each op finds its unit in the state the schedule promises (gathered before it computes, a gradient before its
// reduce-scatter, nothing left held at the end), and calls the backend's hooks. The backend decides how: the CPU
// gathers and reduce-scatters in place; the GPU issues collectives on a second stream and uses prefetch() to run
// gathers ahead of their op, as nccl-tests' one driver calls each collective's hooks.
//
//   class MyBackend : ScheduleExecutor { ... };
//   run_schedule(training_schedule(n_layer), executor);
#pragma once

#include <cstddef>
#include <vector>

#include "shardtrain/shard/schedule.h"

namespace st {

class ScheduleExecutor {
 public:
  virtual ~ScheduleExecutor() = default;
  // Before op `at` runs: a backend that gathers ahead issues those gathers here (in schedule order, the same on
  // every rank, so the collectives match). Default: nothing.
  virtual void prefetch(const std::vector<ScheduleOp>& schedule, size_t at) {}
  // The unit's full parameters are needed from here on (op `at`); a backend that already issued this gather in
  // prefetch() skips it.
  virtual void gather(int unit, size_t at) = 0;
  virtual void embedding_forward() = 0;       // unit 0
  virtual void block_forward(int unit) = 0;   // units 1..L
  virtual void head(int unit) = 0;            // final LN, classifier and loss; in training also the start of backward
  virtual void block_backward(int unit) = 0;  // into the unit's full gradient
  virtual void embedding_backward() = 0;      // into unit 0's full gradient
  virtual void reduce_scatter(int unit) = 0;  // the unit's full gradient into the owners' shards
  virtual void release(int unit) = 0;         // the unit's full parameters are no longer needed
};

// Runs `schedule` through `executor`. Throws st::Error when the schedule breaks its own order (a unit computed or
// released without being gathered, gathered twice, reduce-scattered without a gradient, anything held at the end).
void run_schedule(const std::vector<ScheduleOp>& schedule, ScheduleExecutor& executor);

}  // namespace st
