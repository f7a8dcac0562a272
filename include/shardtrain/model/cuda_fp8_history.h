// train.fp8=delayed's amax history on the device, where the casts read it: model/fp8_history.h's Fp8AmaxHistory with
// its ring, its largest maxima and the step's running maxima in device memory, changed only by kernels/gpu/
// fp8_history.h's kernels on the caller's stream (the CPU class runs their references), so that a step's casts and
// its end never wait for the host. Only the checkpoint calls, entries() and load(), wait.
//
//   CudaFp8History h(sites, 16);
//   const unsigned* m = h.pick(fp8_history_index(site, kFp8X), own, ctx);   // the cast's maximum, on ctx.stream
//   ... at the step's end: h.step_maxima() all-gathered over the ranks and reduced (gpu::fp8_max_over_ranks), then
//   h.push(reduced, ctx), or h.drop(ctx) for a skipped step
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/model/fp8_history.h"

namespace st {

class CudaFp8History {
 public:
  // sites >= 0; length in [1, 1024]. An empty history.
  CudaFp8History(int64_t sites, int length);

  int64_t sites() const { return sites_; }
  int length() const { return length_; }
  int filled() const { return filled_; }
  int64_t entry_size() const { return sites_ * kFp8Operands; }
  // The device bytes it holds: (length + 3) entries.
  int64_t allocated_bytes() const {
    return static_cast<int64_t>(ring_.bytes() + step_.bytes() + history_max_.bytes() + applied_.bytes());
  }

  // What the cast of operand `index` (fp8_history_index) scales by, given its own maximum at `own` (device, as
  // fp8_maxima_async writes it): gpu::fp8_delayed_maxima into this operand's slot of applied maxima, which the call
  // returns; with recording on, `own` is folded into the step's maxima. On ctx.stream.
  const unsigned* pick(int64_t index, const unsigned* own, const gpu::GpuContext& ctx);
  // Whether pick() records (training passes) or not (evaluation); off until set.
  void set_recording(bool on) { recording_ = on; }
  bool recording() const { return recording_; }
  // The step's running maxima (device, entry_size()), for the reduction over ranks.
  unsigned* step_maxima() { return step_.data(); }
  // The history's largest maxima (device, entry_size()): what a cast scales by once the history holds a step.
  const unsigned* history_max() const { return history_max_.data(); }

  // The step's end, on ctx.stream: `entry` (device, entry_size(): the step's maxima reduced over the ranks; it may be
  // step_maxima()) becomes the newest entry and the step's maxima restart from 0; or, for a skipped step, they are
  // dropped.
  void push(const unsigned* entry, const gpu::GpuContext& ctx);
  void drop(const gpu::GpuContext& ctx);

  // Fp8AmaxHistory::entries and load, for checkpoints: both wait for ctx.stream.
  std::vector<std::vector<float>> entries(const gpu::GpuContext& ctx) const;
  void load(const std::vector<std::vector<float>>& entries, const gpu::GpuContext& ctx);

 private:
  int64_t sites_ = 0;
  int length_ = 1;
  int filled_ = 0;
  int newest_ = -1;  // the ring slot of the newest entry
  bool recording_ = false;
  DeviceBuffer<unsigned> ring_;  // [length_, entry_size()]
  DeviceBuffer<unsigned> step_, history_max_, applied_;
};

}  // namespace st
