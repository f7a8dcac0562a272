#include "shardtrain/shard/device_optimizer.h"

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/adamw.h"
#include "shardtrain/kernels/gpu/reduce.h"

namespace st {

template <typename T>
DeviceOptimizer<T>::DeviceOptimizer(int units, OpTimer& timer)
    : units_(units),
      timer_(timer),
      ctx_{stream_.get(), nullptr, nullptr, 0},
      updated_(static_cast<size_t>(units)),
      unit_sq_(units),
      sq_(1),
      sums_(3),
      gate_(1),
      host_sums_(2),
      host_gate_(1) {}

template <typename T>
double* DeviceOptimizer<T>::norm_part(int unit, cudaStream_t s) {
  double* part = unit_sq_.data() + unit;
  ST_CUDA_CHECK(cudaMemsetAsync(part, 0, sizeof(double), s));
  return part;
}

template <typename T>
double DeviceOptimizer<T>::sum_of_squares(const std::vector<GradView>& grads, const gpu::GpuContext& ctx) {
  {
    OpTimer::Laps lap = timer_.laps(ctx.stream);
    lap("optim.grad_norm");
    if (all_parts()) {
      gpu::sum_in_order(unit_sq_.data(), units_, sq_.data(), ctx);
    } else {  // asked before the step's last micro-step
      ST_CUDA_CHECK(cudaMemsetAsync(sq_.data(), 0, sizeof(double), ctx.stream));
      for (const GradView& g : grads) gpu::sum_of_squares<float>(g.grad, g.count, sq_.data(), ctx);
    }
  }
  double sq = 0;
  ST_CUDA_CHECK(cudaMemcpyAsync(&sq, sq_.data(), sizeof(double), cudaMemcpyDeviceToHost, ctx.stream));
  ST_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  timer_.collect();
  return sq;
}

template <typename T>
void DeviceOptimizer<T>::update(int unit, const UnitState& s, const std::vector<AdamWRun>& runs, const StepGate* gate,
                                cudaStream_t after) {
  cudaStream_t os = stream_.get();
  after_mark_.record(after);
  after_mark_.wait_on(os);
  {
    OpTimer::Laps lap = timer_.laps(os);
    lap("optim.adamw");
    gpu::adamw_update_runs<T>(s.master, s.m, s.v, s.grad, runs, s.compute, ctx_, gate);
  }
  updated_[static_cast<size_t>(unit)].record(os);
}

template <typename T>
void DeviceOptimizer<T>::queue_gate(double earlier_losses, double loss_scale, float grad_clip, NcclCommunicator& shard,
                                    NcclCommunicator* replica, const gpu::GpuContext& ctx) {
  ST_CHECK(all_parts(), "the step's gate: ", parts_, " of ", units_, " units' gradients are final");
  cudaStream_t cs = ctx.stream;
  {
    OpTimer::Laps lap = timer_.laps(cs);
    lap("optim.grad_norm");
    gpu::sum_in_order(unit_sq_.data(), units_, sums_.data(), ctx);
    // This rank's last loss goes to the host before the all-reduce; the earlier ones come up from it.
    host_sums_.data()[1] = earlier_losses;  // read by the copy below, which runs before the next step writes here
    ST_CUDA_CHECK(cudaMemcpyAsync(host_sums_.data(), sums_.data() + 1, sizeof(double), cudaMemcpyDeviceToHost, cs));
    ST_CUDA_CHECK(cudaMemcpyAsync(sums_.data() + 2, host_sums_.data() + 1, sizeof(double), cudaMemcpyHostToDevice, cs));
    shard.all_reduce<double>(sums_.data(), 3, cs);
    // Hybrid: the replicas hold the same shards (the sum of squares is the sharding group's), but their own losses.
    if (replica != nullptr) replica->all_reduce<double>(sums_.data() + 1, 2, cs);
    gpu::decide_step(sums_.data(), loss_scale, grad_clip, gate_.data(), ctx);
    ST_CUDA_CHECK(cudaMemcpyAsync(host_gate_.data(), gate_.data(), sizeof(StepGate), cudaMemcpyDeviceToHost, cs));
  }
  gate_ready_.record(cs);
  gate_marks_ = timer_.recorded();  // the op profile's marks up to the gate; the step's AdamW laps follow
}

template <typename T>
StepGate DeviceOptimizer<T>::finish_gate(double* last_loss_sum) {
  gate_ready_.synchronize();
  // The op profile (profiling only): the marks up to the gate, the last step's AdamW laps among them (done: this
  // step's gathers waited for them). This step's AdamW runs beside the next step's forward, as without the profile,
  // and its laps are collected at the next gate.
  if (timer_.enabled()) timer_.collect_first(gate_marks_);
  *last_loss_sum = host_sums_.data()[0];
  return *host_gate_.data();
}

template class DeviceOptimizer<float>;
template class DeviceOptimizer<bf16>;
template class DeviceOptimizer<fp16>;

}  // namespace st
