// Private to src/shard: the class behind make_cuda_sharded_model (cuda_sharded_model.h), whose members four files
// define by concern: construction, memory and GEMM algorithms (cuda_sharded_model.cu), the schedule's execution
// (cuda_sharded_model_schedule.cu), the optimizer step (cuda_sharded_model_optimizer.cu), and the state moving in and
// out: gathers to the host, pulls, pushes and snapshots (cuda_sharded_model_state.cu). Each file instantiates its
// members for fp32, bf16 and fp16.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "fp8_gatherer.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/stall_timer.h"
#include "shardtrain/kernels/gpu/attention_choice.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/model/cuda_family.h"
#include "shardtrain/shard/comm_tuning.h"
#include "shardtrain/shard/device_optimizer.h"
#include "shardtrain/shard/device_shards.h"
#include "shardtrain/shard/host_plan.h"
#include "shardtrain/shard/memory_plan.h"
#include "shardtrain/shard/model_backend.h"
#include "shardtrain/shard/offload_pipeline.h"
#include "shardtrain/shard/replica_reduction.h"
#include "shardtrain/shard/run_plan.h"
#include "shardtrain/shard/schedule.h"
#include "shardtrain/shard/schedule_runner.h"
#include "shardtrain/shard/shard_collectives.h"
#include "shardtrain/shard/sharding.h"
#include "shardtrain/shard/unit_buffers.h"

namespace st::shard_internal {

// The CUDA backend of ModelBackend: one process per GPU, the schedule run through run_schedule (this class is its
// executor), gathers and reduce-scatters on the communication stream into buffers allocated once. The optimizer
// step is DeviceOptimizer's, optimizer offload is OffloadPipeline's, the memory plan is memory_plan.h's.
template <typename T>
class CudaShardedModel final : public ModelBackend, private ScheduleExecutor {
 public:
  CudaShardedModel(const Config& cfg, Communicator& comm);
  ~CudaShardedModel() override;

  const std::vector<UnitLayout>& units() const override { return units_; }
  Communicator& comm() override { return comm_; }
  Communicator& shard_comm() override { return groups_.shard(); }
  int replica_index() const override { return groups_.replica_index(); }
  std::string describe() const override {
    const char* dtype = std::is_same_v<T, float> ? "fp32" : std::is_same_v<T, bf16> ? "bf16" : "fp16";
    return str_cat(
        "cuda/", dtype, " on ", device_name_, ", attention ", attention_.what, "; sharding ", groups_.why, "; ",
        coll_.tuning().why,
        offload_ ? str_cat(", optim.offload=", to_string(cfg_.optim.offload), " (", offload_->describe(units_), ")")
                 : std::string(),
        fp8_gather_ ? "; the blocks' FP8 weights gathered as E4M3 codes (dist.fp8_gather)" : "");
  }
  std::string device_name() const override { return device_name_; }
  void zero_grads() override;
  void expect_micro_steps(int64_t n) override { micro_steps_left_ = n; }
  void speculate_optimizer(std::vector<std::vector<AdamWRun>> runs) override {
    if (offload_) offload_->set_speculative_runs(std::move(runs));
  }
  void drop_speculation() override {
    if (offload_) offload_->drop_speculation();
  }
  bool speculates() const override { return offload_ && offload_->speculates(); }
  double micro_step(const int32_t* inputs, const int32_t* targets, float dloss) override;
  void set_dropout_batch(int64_t first_sequence) override { first_sequence_ = first_sequence; }
  bool gates_on_device() const override { return !(offload_ && offload_->any()); }
  void micro_step_queued(const int32_t* inputs, const int32_t* targets, float dloss) override;
  void queue_gated_update(double earlier_losses, double loss_scale, float grad_clip,
                          const std::vector<std::vector<AdamWRun>>& runs) override;
  GatedStep finish_gated_step() override;
  double eval_micro(const int32_t* inputs, const int32_t* targets) override;
  void last_logits(const int32_t* tokens, int64_t len, std::vector<float>* logits) override;
  double grad_sum_of_squares() override;
  void adamw(int unit, const std::vector<AdamWRun>& runs) override;
  std::vector<float> gather_params(int unit) override { return gather_full(unit, /*grads=*/false); }
  std::vector<float> gather_grads(int unit) override { return gather_full(unit, /*grads=*/true); }
  std::vector<float> gather_frozen(int unit) override;
  UnitShard& shard(int unit) override {
    if (offload(unit)) return offload_->state(unit);  // the state the host AdamW writes
    return shards_->view(unit);
  }
  void pull_unit(int unit) override;
  void push_unit(int unit) override;
  void release_unit(int unit) override;
  int64_t held_unit_views() const override { return shards_->views_held(); }
  void snapshot_state(StateSnapshot* snap) override;
  void reserve_snapshot(StateSnapshot* snap) override;
  MemoryStats memory() const override;
  int64_t peak_memory_bytes() override {
    sample_device_memory();
    return device_peak_bytes_;
  }
  const CommCounters& counters() const override { return counters_; }
  // Both collect the marks still pending first: the last step's AdamW laps, collected otherwise at the next gate.
  std::string op_profile(int64_t steps) override {
    if (!model_->timer().enabled()) return std::string();
    model_->timer().collect();
    return model_->timer().report(steps);
  }
  void reset_op_profile() override {
    model_->timer().collect();
    model_->timer().reset();
  }
  GemmAlgorithms gemm_algorithms() const override {
    return {device_name_, static_cast<int64_t>(cublasLtGetVersion()), blas_.algorithms()};
  }
  void use_gemm_algorithms(const GemmAlgorithms& a) override;
  double take_exposed_comm_ms() override { return stalls_.take_ms(); }
  void fp8_step_end(bool applied) override;
  // dist.fp8_gather under delayed: the communication stream waits for the history's push or drop (fp8_step_end).
  void gathers_follow_fp8_step_end();
  std::vector<std::vector<float>> fp8_history() override;
  void load_fp8_history(const std::vector<std::vector<float>>& entries, const std::string& from) override;

 private:
  using Buffer = typename UnitBuffers<T>::Buffer;
  enum class Mode { kTrain, kEval, kLogits };
  bool offload(int unit) const { return offload_ && offload_->holds(unit); }
  void quiesce_state();
  // Every unit's shard size over the sharding group, in unit order; hybrid's bucket size in elements of T.
  std::vector<int64_t> shard_slots() const {
    std::vector<int64_t> slots;
    for (const UnitLayout& u : units_) slots.push_back(padded_shard_size(u.numel, groups_.shard().world_size()));
    return slots;
  }
  int64_t replica_bucket_size() const { return coll_.tuning().bucket_bytes / static_cast<int64_t>(sizeof(T)); }
  // The last micro-step's reduce-scatter of `unit` is accumulated: hybrid sums the shard across nodes (in buckets, on
  // the replica stream); its share of the norm is taken; with optim.offload the shard then goes to the host.
  // `norm_taken`: the accumulation took the shard's share of the norm (squares_of).
  void finish_grad(int unit, bool norm_taken);
  // Where the accumulation into `unit`'s shard takes the shard's share of the norm as it writes it: the step's last
  // micro-step without hybrid (whose shards become final only after the all-reduce across nodes); else null.
  double* squares_of(int unit);
  // The stream on which gradient shards become final: the replica stream in hybrid, else the communication stream.
  cudaStream_t final_grad_stream() { return replica_ ? replica_->stream() : comm_stream_.get(); }
  CommPlan comm_plan() const {
    return {coll_.tuning().prefetch_depth, replica_bucket_elements_, coll_.tuning().copy_engine_reduce_scatters};
  }
  void wait_for_comm(const CudaEvent& done, const char* what);
  // Folds the device memory in use now (cudaMemGetInfo: total - free) into device_peak_bytes_.
  void sample_device_memory();
  // train.fp8=delayed: whether the casts record their maxima into the history's step maxima (training passes).
  void record_fp8_maxima(bool on) {
    if (CudaFp8History* h = model_->fp8_history()) h->set_recording(on);
  }
  void after_sync();
  // AdamW of a unit whose optimizer is on the device (DeviceOptimizer); gate: the device's decision, or null.
  void device_adamw(int unit, const std::vector<AdamWRun>& runs, const StepGate* gate);
  void check_runs(int unit, const std::vector<AdamWRun>& runs) const;  // each run inside the unit's span

  double run(const std::vector<ScheduleOp>& schedule, Mode mode, const int32_t* targets, float dloss);
  // ScheduleExecutor: collectives are issued on the communication stream, compute on the compute stream.
  void prefetch(const std::vector<ScheduleOp>& schedule, size_t at) override;
  void gather(int unit, size_t at) override;
  void embedding_forward() override { model_->embedding_forward(gathered(0), tokens_, batch_, len_); }
  void block_forward(int unit) override { model_->block_forward(unit - 1, gathered(unit)); }
  void head(int unit) override;
  void block_backward(int unit) override { model_->block_backward(unit - 1, gathered(unit), full_grad(unit)); }
  void embedding_backward() override { model_->embedding_backward(full_grad(0)); }
  void reduce_scatter(int unit) override;
  void release(int unit) override { release_params(unit); }

  void issue_gather(int unit);
  const T* gathered(int unit);
  T* full_grad(int unit);
  void release_params(int unit);
  void prefetch_embedding();
  std::vector<float> gather_full(int unit, bool grads);
  // All-gathers `slot` elements of every rank's `source` (device memory, or host memory when source_on_host) into
  // the host's dst, world * slot elements in rank order, a piece of kGatherPieceBytes at a time: the device holds one
  // piece of every rank's shard, not the unit.
  template <typename E>
  void gather_to_host(const E* source, bool source_on_host, int64_t slot, E* dst);
  // ST_CHECK that the last snapshot's writer has released the offloaded state (snapshot_held_).
  void check_snapshot_released(const char* caller) const;

  int64_t first_sequence_ = -1;  // set_dropout_batch, for the next micro-step only
  Config cfg_;
  Communicator& comm_;
  std::vector<UnitLayout> units_;
  ShardingGroups groups_;  // dist.sharding: the world, or this node's ranks plus the replica group
  // The sharding group's NCCL communicators (and hybrid's replica group's), and the tuning resolved for its link.
  ShardCollectives coll_;
  int64_t replica_bucket_elements_ = 0;  // hybrid: ReplicaReduction's staging buffer, planned before it exists
  std::string device_name_;
  RunTarget target_;           // this run as `shardtrain plan` targets it (its device budget taken at the memory check)
  int gemm_candidates_ = 0;    // train.gemm_autotune resolved
  int gemm_timed_logged_ = 0;  // GEMM shapes timed when the log last said so
  gpu::Cudnn cudnn_;
  gpu::AttentionChoice attention_;
  MemoryPlan plan_;
  HostPlan host_plan_;  // checked before the host state and the pinned buffers are allocated
  // Above the optimizer's stream (DeviceOptimizer), whose AdamW of every unit a step's end queues beside the next
  // step's forward: the forward's and the gathers' kernels take the SMs first, and AdamW's blocks fill what they leave.
  CudaStream compute_stream_{CudaStream::Priority::kHigh}, comm_stream_{CudaStream::Priority::kHigh};
  // snapshot_state(): the copy stream, the event it starts after, and per unit the end of the unit's copy, which that
  // unit's next AdamW waits for while snapshot_fence_ says so.
  CudaStream snapshot_stream_;
  CudaEvent snapshot_after_;
  std::vector<CudaEvent> snapshot_copied_;
  std::vector<bool> snapshot_fence_;
  gpu::Blas blas_;
  DeviceBuffer<unsigned char> scratch_, comm_scratch_;
  gpu::GpuContext ctx_, comm_ctx_;
  std::unique_ptr<CudaUnitModel<T>> model_;  // cfg.model.arch's CUDA model (cuda_family.h)
  DeviceOptimizer<T> optimizer_;             // AdamW beside the next step's forward, the norm and the on-device gate
  std::unique_ptr<DeviceShards<T>> shards_;  // this rank's sharded state on the device
  std::unique_ptr<OffloadPipeline<T>> offload_;  // optim.offload; null without it
  // The last snapshot's offloaded units, each true once its writer released their host state (snapshot_state).
  std::shared_ptr<std::vector<std::atomic<bool>>> snapshot_held_;
  int64_t micro_steps_left_ = 0;             // expect_micro_steps(), counted down by micro_step()
  bool last_micro_ = true;                   // the running micro-step is the step's last
  bool summed_across_nodes_ = false;         // hybrid: this step's gradients went across nodes (zero_grads clears)
  std::unique_ptr<UnitBuffers<T>> buffers_;  // the gathered parameters and full gradients
  std::vector<bool> in_place_;  // per unit: it reads its parameters from its shard (units_in_place: one rank)
  DeviceBuffer<T> rs_out_;
  DeviceBuffer<uint8_t> nf4_full_;  // an NF4 unit's gathered storage, dequantised from (world > 1; model/nf4_base.h)
  std::unique_ptr<Fp8Gatherer<T>> fp8_gather_;    // dist.fp8_gather; null without it
  std::unique_ptr<ReplicaReduction<T>> replica_;  // hybrid: the all-reduce across nodes, once per step
  DeviceBuffer<unsigned> fp8_gathered_;           // train.fp8=delayed: every rank's step maxima (fp8_step_end)
  CudaEvent fp8_step_ended_;                      // delayed with dist.fp8_gather: the history's push, for the gathers
  // loss_queued_: micro_step_queued() left its loss on the device; gate_queued_: queue_gated_update() ran and
  // finish_gated_step() has not.
  bool loss_queued_ = false, gate_queued_ = false;
  CudaEvent compute_mark_, comm_mark_, replica_mark_;
  // zero_grads() was called and no micro-step has finished since: the reduce-scatters write the gradient shards
  // rather than add to them, so nothing zeroes them.
  bool fresh_grads_ = false;
  StallTimer stalls_;  // the compute stream's waits on communication (take_exposed_comm_ms)
  CommCounters counters_;
  int64_t device_peak_bytes_ = 0;  // peak_memory_bytes(): the most device memory seen in use
  // The schedule being run: how far its gathers have been issued.
  size_t next_gather_ = 0;
  // The optimizer has already issued the next run's first op, "gather 0" (prefetch_embedding).
  bool embedding_prefetched_ = false;
  // The schedule being run: its batch, mode, targets and loss scale.
  const int32_t* tokens_ = nullptr;
  int64_t batch_ = 0, len_ = 0;
  std::vector<float>* logits_out_ = nullptr;
  Mode mode_ = Mode::kTrain;
  // Moves wherever a shard or the amax history may change (a step's start, the optimizer, a load, the history's step
  // end): dist.fp8_gather_keep's kept blocks serve the training gathers of one epoch (fp8_gatherer.h).
  int64_t params_epoch_ = 0;
  const int32_t* targets_ = nullptr;
  float dloss_ = 0.0f;
};

}  // namespace st::shard_internal
