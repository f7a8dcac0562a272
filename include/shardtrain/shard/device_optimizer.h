// The CUDA backend's optimizer step on the device: AdamW on its own stream, beside the next step's forward, and
// the step's global gradient norm and skip/clip decision without a host round trip.
//
// It owns the optimizer stream, one "updated" event per unit (the next gather of a unit waits for its update
// only), each unit's share of the squared gradient norm (taken by whoever finalises the unit's gradient shard, as it
// becomes final), and the buffers of the on-device gate: [sum of squares, last micro-step's loss sum, the earlier
// ones'] all-reduced, the StepGate that AdamW reads, and their copies on the host.
//
//   DeviceOptimizer<bf16> opt(n_units, timer);
//   opt.reset_norm();                                            // zero_grads
//   accumulate(..., opt.norm_part(u, s)); opt.part_done();        // as each unit's shard becomes final
//   opt.queue_gate(earlier, scale, clip, nccl, replica, ctx);    // after the backward, on ctx.stream
//   for (u...) opt.update(u, state_of(u), runs[u], opt.gate(), compute_stream);
//   StepGate g = opt.finish_gate(&last_loss_sum);                // waits for the decision, not for AdamW
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/comm/nccl_communicator.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/cuda_timer.h"
#include "shardtrain/kernels/adamw.h"
#include "shardtrain/kernels/gpu/context.h"

namespace st {

template <typename T>
class DeviceOptimizer {
 public:
  // What AdamW updates for one unit: the fp32 master, moments and gradient shard, and the compute-type copy the
  // gathers read (null when T is float: they read the master).
  struct UnitState {
    float* master = nullptr;
    float* m = nullptr;
    float* v = nullptr;
    const float* grad = nullptr;
    T* compute = nullptr;
  };
  // A unit's final gradient shard: `count` owned elements.
  struct GradView {
    const float* grad = nullptr;
    int64_t count = 0;
  };

  // `timer`: the op profile the optimizer's kernels are recorded in; it must outlive this.
  DeviceOptimizer(int units, OpTimer& timer);

  cudaStream_t stream() const { return stream_.get(); }

  // The norm. reset_norm() starts a step. norm_part(u, s) zeroes unit u's share on stream s and returns it for the
  // kernel that finalises the shard to add the squares into; part_done() counts one finished unit.
  void reset_norm() { parts_ = 0; }
  double* norm_part(int unit, cudaStream_t stream);
  void part_done() { ++parts_; }
  bool all_parts() const { return parts_ == units_; }
  // The sum of squares of every unit's final shard, in double, the same bits whichever way it was taken: the parts
  // summed in order when all are in, else the shards' squares summed directly. Synchronises ctx.stream, which must
  // follow the streams that finalised the shards.
  double sum_of_squares(const std::vector<GradView>& grads, const gpu::GpuContext& ctx);

  // The next gather of `unit` (on stream s) waits for its last update.
  void wait_updated(int unit, cudaStream_t s) const { updated_[static_cast<size_t>(unit)].wait_on(s); }
  // AdamW over `runs` of the unit on the optimizer stream, after what `after` has queued; gate: the device's
  // decision (gate()), or null to update unconditionally with the runs' own grad_scale.
  void update(int unit, const UnitState& state, const std::vector<AdamWRun>& runs, const StepGate* gate,
              cudaStream_t after);

  // Where the step's last micro-step leaves its loss sum (CudaUnitModel::move_loss_sum) for queue_gate().
  double* loss_slot() { return sums_.data() + 1; }
  // On ctx.stream, after the last micro-step: the norm's parts summed in order, this rank's losses (the last one
  // from loss_slot(), `earlier_losses` from the host), all-reduced over `shard` (and the losses over `replica` in
  // hybrid: a non-finite loss anywhere skips the step everywhere), and the decision (st::decide_step) in gate().
  void queue_gate(double earlier_losses, double loss_scale, float grad_clip, NcclCommunicator& shard,
                  NcclCommunicator* replica, const gpu::GpuContext& ctx);
  const StepGate* gate() const { return gate_.data(); }
  // Waits for the decision (not for the AdamW behind it); *last_loss_sum: this rank's last micro-step's loss sum.
  StepGate finish_gate(double* last_loss_sum);

  void synchronize() { stream_.synchronize(); }

 private:
  int units_;
  OpTimer& timer_;
  CudaStream stream_;
  gpu::GpuContext ctx_;
  CudaEvent after_mark_;
  std::vector<CudaEvent> updated_;  // per unit: its last update is done; never recorded: none
  DeviceBuffer<double> unit_sq_;    // each unit's share of the norm
  int parts_ = 0;                   // units whose share is in since reset_norm()
  DeviceBuffer<double> sq_;         // sum_of_squares()'s result
  DeviceBuffer<double> sums_;       // the gate's [sum of squares, last loss sum, earlier loss sums]
  DeviceBuffer<StepGate> gate_;
  PinnedBuffer<double> host_sums_;  // [this rank's last loss sum, its earlier losses]
  PinnedBuffer<StepGate> host_gate_;
  CudaEvent gate_ready_;
  size_t gate_marks_ = 0;  // the op profile's uncollected marks when the gate was queued (OpTimer::recorded)
};

}  // namespace st
