#include "shardtrain/shard/cuda_sharded_model.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <future>
#include <memory>
#include <type_traits>

#include "shardtrain/comm/gpu_topology.h"
#include "shardtrain/comm/nccl_communicator.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/log.h"
#include "shardtrain/core/stall_timer.h"
#include "shardtrain/kernels/gpu/attention_choice.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/kernels/gpu/reduce.h"
#include "shardtrain/model/cuda_family.h"
#include "shardtrain/shard/comm_tuning.h"
#include "shardtrain/shard/cuda_memory_plan.h"
#include "shardtrain/shard/device_optimizer.h"
#include "shardtrain/shard/device_shards.h"
#include "shardtrain/shard/memory_plan.h"
#include "shardtrain/shard/offload_pipeline.h"
#include "shardtrain/shard/replica_reduction.h"
#include "shardtrain/shard/schedule.h"
#include "shardtrain/shard/schedule_runner.h"
#include "shardtrain/shard/shard_collectives.h"
#include "shardtrain/shard/sharding.h"
#include "shardtrain/shard/unit_buffers.h"

namespace st {
namespace {

bool is_compute_op(OpKind k) {
  return k == OpKind::kForward || k == OpKind::kBackward || k == OpKind::kHeadForwardBackward;
}

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
                 : std::string());
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
  UnitShard& shard(int unit) override {
    if (offload(unit)) return offload_->state(unit);  // the state the host AdamW writes
    return shards_->view(unit);
  }
  void pull_state() override;
  void push_state() override;
  void snapshot_state(StateSnapshot* snap) override;
  void reserve_snapshot(StateSnapshot* snap) override;
  MemoryStats memory() const override;
  int64_t peak_memory_bytes() override {
    sample_device_memory();
    return device_peak_bytes_;
  }
  const CommCounters& counters() const override { return counters_; }
  std::string op_profile(int64_t steps) override {
    return model_->timer().enabled() ? model_->timer().report(steps) : std::string();
  }
  void reset_op_profile() override { model_->timer().reset(); }
  GemmAlgorithms gemm_algorithms() const override {
    return {device_name_, static_cast<int64_t>(cublasLtGetVersion()), blas_.algorithms()};
  }
  void use_gemm_algorithms(const GemmAlgorithms& a) override;
  double take_exposed_comm_ms() override { return stalls_.take_ms(); }

 private:
  using Buffer = typename UnitBuffers<T>::Buffer;
  enum class Mode { kTrain, kEval, kLogits };
  bool offload(int unit) const { return offload_ && offload_->holds(unit); }
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

  Config cfg_;
  Communicator& comm_;
  std::vector<UnitLayout> units_;
  ShardingGroups groups_;  // dist.sharding: the world, or this node's ranks plus the replica group
  // The sharding group's NCCL communicators (and hybrid's replica group's), and the tuning resolved for its link.
  ShardCollectives coll_;
  int64_t replica_bucket_elements_ = 0;  // hybrid: ReplicaReduction's staging buffer, planned before it exists
  std::string device_name_;
  int gemm_candidates_ = 0;    // train.gemm_autotune resolved
  int gemm_timed_logged_ = 0;  // GEMM shapes timed when the log last said so
  gpu::Cudnn cudnn_;
  gpu::AttentionChoice attention_;
  MemoryPlan plan_;
  CudaStream compute_stream_, comm_stream_;
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
  std::shared_future<void> snapshot_copier_;     // the last snapshot's copies of host-resident units (before offload_
                                                 // in destruction: it reads the host state)
  int64_t micro_steps_left_ = 0;                 // expect_micro_steps(), counted down by micro_step()
  bool last_micro_ = true;                       // the running micro-step is the step's last
  bool summed_across_nodes_ = false;             // hybrid: this step's gradients went across nodes (zero_grads clears)
  std::unique_ptr<UnitBuffers<T>> buffers_;      // the gathered parameters and full gradients
  DeviceBuffer<T> rs_out_;
  std::unique_ptr<ReplicaReduction<T>> replica_;  // hybrid: the all-reduce across nodes, once per step
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
  const int32_t* targets_ = nullptr;
  float dloss_ = 0.0f;
};

template <typename T>
CudaShardedModel<T>::CudaShardedModel(const Config& cfg, Communicator& comm)
    : cfg_(cfg),
      comm_(comm),
      units_(build_units(cfg.model)),
      groups_(make_sharding_groups(cfg, comm, cuda_auto_sharding_inputs(cfg, comm))),
      coll_(cfg.dist, groups_, comm),  // binds this rank's GPU before anything is allocated
      replica_bucket_elements_(groups_.replica ? ReplicaReduction<T>::capacity_for(shard_slots(), replica_bucket_size())
                                               : 0),
      device_name_(cuda_device_name()),
      cudnn_(),
      attention_(gpu::choose_attention<T>(
          {cfg.train.attention, cfg.train.deterministic, static_cast<int>(cfg.train.micro_batch), cfg.model.seq_len,
           cfg.model.n_embd, cfg.model.n_head, cfg.model.kv_heads(), cfg.model.head_dim()},
          cudnn_)),
      plan_(
          checked_cuda_plan<T>(cfg, groups_.shard().world_size(), comm_plan(), device_name_, attention_.scratch_bytes)),
      blas_(),
      scratch_(cuda_model_family<T>(cfg.model.arch)
                   .footprint(cfg.model, cfg.train.micro_batch, cfg.train.recompute, attention_.scratch_bytes)
                   .scratch_bytes),
      comm_scratch_(static_cast<int64_t>(gpu::reduce_scratch_bytes())),
      ctx_{compute_stream_.get(), &blas_, scratch_.data(), scratch_.bytes(), &cudnn_},
      comm_ctx_{comm_stream_.get(), nullptr, comm_scratch_.data(), comm_scratch_.bytes()},
      model_(cuda_model_family<T>(cfg.model.arch)
                 .make_model(cfg.model, cfg.train.micro_batch, cfg.train.recompute, attention_.cudnn, ctx_,
                             attention_.backward)),
      optimizer_(static_cast<int>(units_.size()), model_->timer()) {
  if (comm.local_rank() == 0) {  // each machine's GPUs and links, as `shardtrain topo` prints them
    char host[64] = {};
    gethostname(host, sizeof(host) - 1);
    ST_LOG_INFO(format_gpu_topology(discover_gpu_topology(), host), "  network: ", nccl_network_summary());
  }
  coll_.split(groups_.shard());
  const int world = groups_.shard().world_size(), rank = groups_.shard().rank();
  NcclCommunicator* const gather_windows = coll_.gather_windows();
  NcclCommunicator* const grad_windows = coll_.grad_windows();
  // Rank 0 times each GEMM's candidates and every rank takes its pick: one set of algorithms for the run.
  gemm_candidates_ = static_cast<int>(cfg.train.gemm_autotune);
  blas_.set_tuning(gemm_candidates_, comm.rank() == 0, [this](int pick) {
    int32_t p = pick;
    comm_.broadcast(&p, sizeof(p), 0);
    return static_cast<int>(p);
  });
  const std::vector<bool> offloaded = offloaded_units(cfg, units_);
  const auto params_on_host = [&](int u) {
    return offloaded[static_cast<size_t>(u)] && cfg.optim.offload == OffloadMode::kOptimizerParams;
  };
  const UnitSizes s = unit_sizes(units_, world);
  // The gathers' sources (each unit's shard in T, read on the device) and destinations, in two symmetric windows of
  // the zero-CTA communicator for copy-engine gathers (each buffer its own allocation otherwise).
  int64_t source_bytes = 0;
  for (const UnitLayout& u : units_)
    if (!params_on_host(u.index)) source_bytes += WindowArena::bytes_for(padded_shard_size(u.numel, world), sizeof(T));
  WindowArena sources(gather_windows, source_bytes);
  const int64_t pool_size = param_pool_size(cfg, comm_plan());
  WindowArena gathered(gather_windows, WindowArena::bytes_for(s.emb_full, sizeof(T)) +
                                           pool_size * WindowArena::bytes_for(s.unit_full, sizeof(T)));
  typename DeviceShards<T>::Offloaded for_offload;  // optim.offload: the initial state of the units it holds
  shards_ = std::make_unique<DeviceShards<T>>(cfg, units_, rank, world, offloaded,
                                              cfg.optim.offload == OffloadMode::kOptimizerParams, sources, ctx_,
                                              &for_offload);
  // The full gradients and, for copy-engine reduce-scatters, their all-to-all's output: in a third window then.
  const int64_t exchanged = std::max(s.emb_full, s.unit_full);
  WindowArena grads(grad_windows, WindowArena::bytes_for(s.emb_full, sizeof(T)) +
                                      grad_pool_size(comm_plan()) * WindowArena::bytes_for(s.unit_full, sizeof(T)) +
                                      WindowArena::bytes_for(exchanged, sizeof(T)));
  buffers_ =
      std::make_unique<UnitBuffers<T>>(static_cast<int>(units_.size()), s.emb_full, s.unit_full,
                                       static_cast<int>(pool_size), grad_pool_size(comm_plan()), gathered, grads);
  if (groups_.replica)
    replica_ = std::make_unique<ReplicaReduction<T>>(shard_slots(), replica_bucket_size(), *coll_.replica());
  rs_out_ = coll_.exchange() ? grads.take<T>(exchanged) : DeviceBuffer<T>(s.max_slot);
  counters_.gathers.assign(units_.size(), 0);
  counters_.reduce_scatters.assign(units_.size(), 0);
  if (cfg.optim.offload != OffloadMode::kNone) {
    typename OffloadPipeline<T>::Options o;
    o.mode = cfg.optim.offload;
    o.speculation = cfg.optim.offload_speculative;
    o.threads = static_cast<int>(cfg.optim.offload_threads);
    o.local_rank = comm.device_rank();  // the machine's CPUs, also under SHARDTRAIN_NODE_ID stand-ins
    o.local_size = comm.device_ranks();
    o.device = coll_.shard().device();
    o.log = comm.rank() == 0;
    offload_ = std::make_unique<OffloadPipeline<T>>(o, offloaded, std::move(for_offload.states),
                                                    std::move(for_offload.copies));
  }
  compute_stream_.synchronize();
  sample_device_memory();
}

template <typename T>
void CudaShardedModel<T>::sample_device_memory() {
  size_t free_b = 0, total_b = 0;
  ST_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  device_peak_bytes_ = std::max(device_peak_bytes_, static_cast<int64_t>(total_b - free_b));
}

template <typename T>
CudaShardedModel<T>::~CudaShardedModel() {
  // Outstanding work references our buffers; let it finish before they are freed (the offload pipeline, destroyed
  // first, waits for its own streams and host jobs).
  for (cudaStream_t s : {comm_stream_.get(), compute_stream_.get(), optimizer_.stream()}) cudaStreamSynchronize(s);
}

template <typename T>
void CudaShardedModel<T>::zero_grads() {
  // No memset: the next micro-step's reduce-scatters overwrite the shards (fresh_grads_). They run on the
  // communication stream after the compute stream's backward ops, so the previous step's copies of the gradients to
  // the host are done before they do: the compute stream waits for those (start_step; with
  // optim.offload_speculative the optimizer does not wait for them).
  if (offload_) offload_->start_step(compute_stream_.get());
  fresh_grads_ = true;
  optimizer_.reset_norm();
  summed_across_nodes_ = false;
  if (replica_) replica_->drop();  // a step cut short (an exception in its backward) left units in a bucket
}

template <typename T>
void CudaShardedModel<T>::issue_gather(int unit) {
  Buffer* b = &buffers_->take_params(unit);
  const int64_t slot = shards_->view(unit).slot;
  cudaStream_t ns = comm_stream_.get();
  b->free.wait_on(ns);                // the unit that held it has finished computing
  optimizer_.wait_updated(unit, ns);  // the shard its device AdamW writes (optimizer stream)
  bool staged = false;                // optim.offload=optimizer+params: a staging buffer filled from the host
  const T* source = offload(unit) ? offload_->gather_source(unit, ns, &staged) : shards_->gather_source(unit);
  coll_.gather_comm(staged).all_gather<T>(source, slot, b->data.data(), ns);
  if (staged) offload_->gather_issued(ns);
  b->ready.record(ns);
  ++counters_.gathers[static_cast<size_t>(unit)];
  counters_.gathered_elements += slot * coll_.shard().world_size();
  counters_.cross_node_bytes += groups_.shard_cross_bytes(slot, sizeof(T));
}

// Issues, in schedule order, every gather that lies at most prefetch_depth compute ops ahead of `at` and has a free
// buffer: the next units' parameters arrive while the current one computes. Every rank makes the same decisions,
// so the NCCL calls match across ranks.
template <typename T>
void CudaShardedModel<T>::prefetch(const std::vector<ScheduleOp>& schedule, size_t at) {
  int computes = 0;
  size_t i = at;
  for (; i < next_gather_; ++i) computes += is_compute_op(schedule[i].kind) ? 1 : 0;
  for (; i < schedule.size(); ++i) {
    const ScheduleOp& op = schedule[i];
    if (op.kind == OpKind::kGather) {
      // A unit still held from an earlier op (the last block, between its forward and its backward's gather) must
      // be released before it is gathered again; so must a buffer be free.
      if (!buffers_->can_take_params(op.unit)) return;
      issue_gather(op.unit);
      next_gather_ = i + 1;
    } else if (is_compute_op(op.kind) && ++computes > coll_.tuning().prefetch_depth) {
      return;
    }
  }
}

template <typename T>
const T* CudaShardedModel<T>::gathered(int unit) {
  Buffer* b = buffers_->params(unit);
  ST_CHECK(b != nullptr, "unit ", unit, " used without being gathered");
  wait_for_comm(b->ready, unit == 0 ? "comm_wait.gather_embedding" : "comm_wait.gather");
  return b->data.data();
}

template <typename T>
T* CudaShardedModel<T>::full_grad(int unit) {
  Buffer* slot = buffers_->grads(unit);
  if (slot == nullptr) {  // first use in this micro-step
    slot = &buffers_->take_grads(unit);
    cudaStream_t cs = compute_stream_.get();
    wait_for_comm(slot->free, "comm_wait.grad_buffer");  // its previous reduce-scatter has read it
    // Only the embedding's is zeroed: a tied classifier and the token lookup add to it. A block's and the head's
    // backward write theirs (cuda_unit_model.h). What lies past a unit's elements goes into the reduce-scatter's
    // padding, which nothing reads.
    if (unit == 0) {
      const int64_t n = shards_->view(0).slot * coll_.shard().world_size();
      zero_async(slot->data, n, cs);
    }
  }
  return slot->data.data();
}

template <typename T>
void CudaShardedModel<T>::reduce_scatter(int unit) {
  Buffer* b = buffers_->grads(unit);
  ST_CHECK(b != nullptr, "reduce-scatter of unit ", unit, " without a gradient");
  const UnitShard& h = shards_->view(unit);
  cudaStream_t ns = comm_stream_.get();
  b->ready.record(compute_stream_.get());
  b->ready.wait_on(ns);
  const GradWrite write = fresh_grads_ ? GradWrite::kOverwrite : GradWrite::kAccumulate;
  float* const shard_grad = shards_->grad(unit).data();
  double* const squares = squares_of(unit);
  const int world = coll_.shard().world_size();
  if (NcclCommunicator* exchange = coll_.exchange()) {
    // Each rank's slice q goes to rank q on the copy engines; this rank adds the slices it received in rank order
    // as it takes them into its shard (the addition NCCL's reduce-scatter kernel would have made on the SMs).
    exchange->all_to_all<T>(b->data.data(), h.slot, rs_out_.data(), ns);
    if (fresh_grads_) optimizer_.wait_updated(unit, ns);
    gpu::accumulate_parts<T>(shard_grad, rs_out_.data(), world, h.slot, h.span.count, comm_ctx_, write, squares);
  } else {
    coll_.reduce_scatter_comm(unit).reduce_scatter<T>(b->data.data(), h.slot, rs_out_.data(), ns);
    // The step's first write of the shard replaces the last step's gradient, which that step's AdamW read.
    if (fresh_grads_) optimizer_.wait_updated(unit, ns);
    gpu::accumulate<T>(shard_grad, rs_out_.data(), h.span.count, comm_ctx_, write, squares);
  }
  if (last_micro_) finish_grad(unit, squares != nullptr);  // overlaps the rest of the backward
  buffers_->release_grads(unit, ns);
  ++counters_.reduce_scatters[static_cast<size_t>(unit)];
  counters_.reduce_scattered_elements += h.slot * world;
  counters_.cross_node_bytes += groups_.shard_cross_bytes(h.slot, sizeof(T));
}

template <typename T>
double* CudaShardedModel<T>::squares_of(int unit) {
  if (!last_micro_ || replica_) return nullptr;
  return optimizer_.norm_part(unit, comm_stream_.get());
}

template <typename T>
void CudaShardedModel<T>::finish_grad(int unit, bool norm_taken) {
  std::vector<int> finished{unit};
  if (replica_) {
    finished = replica_->add(unit, *shards_, comm_stream_.get(), groups_, counters_);
    summed_across_nodes_ = replica_->idle();  // the step's last unit went out
  }
  // The norm's share of each finished shard, here rather than after the backward, where it would hold up the
  // optimizer: on the stream that finished it (each has reduction scratch of its own), unless the accumulation took it.
  const gpu::GpuContext& final_ctx = replica_ ? replica_->ctx() : comm_ctx_;
  for (int u : finished) {
    if (!norm_taken)
      gpu::sum_of_squares<float>(shards_->grad(u).data(), shards_->view(u).span.count,
                                 optimizer_.norm_part(u, final_ctx.stream), final_ctx);
    optimizer_.part_done();
  }
  for (int u : finished)
    if (offload(u)) offload_->grad_final(u, shards_->grad(u), final_grad_stream());
}

template <typename T>
void CudaShardedModel<T>::release_params(int unit) {
  buffers_->release_params(unit, compute_stream_.get());
}

// Every schedule starts with "gather 0", the largest unit (the tied embedding), and nothing can compute
// before it arrives. So as soon as the optimizer has updated unit 0's shard, its all-gather for the next run
// goes out on the communication stream, to overlap the optimizer steps of the other units instead of
// starting the next step. Every rank steps the same units in the same order, so the collectives still match.
template <typename T>
void CudaShardedModel<T>::prefetch_embedding() {
  issue_gather(0);  // after unit 0's update (updated_, or with offload its upload)
  embedding_prefetched_ = true;
}

template <typename T>
double CudaShardedModel<T>::run(const std::vector<ScheduleOp>& schedule, Mode mode, const int32_t* targets,
                                float dloss) {
  cudaStream_t cs = compute_stream_.get(), ns = comm_stream_.get();
  // Nothing the communication stream issues from here overtakes what the compute stream has queued before (a unit's
  // gather waits for its optimizer update by itself: issue_gather).
  compute_mark_.record(cs);
  compute_mark_.wait_on(ns);
  // The op profile is the training steps' (and their optimizer's, which follows a training run): evaluation and
  // sampling record nothing in it.
  model_->timer().pause(mode != Mode::kTrain);
  next_gather_ = 0;
  if (embedding_prefetched_) {
    ST_CHECK(!schedule.empty() && schedule[0] == (ScheduleOp{OpKind::kGather, 0}),
             "a schedule that does not start by gathering unit 0 after the optimizer prefetched it");
    next_gather_ = 1;
    embedding_prefetched_ = false;
  }
  mode_ = mode;
  targets_ = targets;
  dloss_ = dloss;
  run_schedule(schedule, *this);
  ST_CHECK(buffers_->in_use_bytes() == 0, "the schedule left ", buffers_->in_use_bytes(), " bytes of buffers in use");
  // The optimizer and the next step's zeroing must see every accumulated gradient (and, in hybrid, its sum across
  // nodes, which the last micro-step issued).
  comm_mark_.record(ns);
  wait_for_comm(comm_mark_, "comm_wait.step_end");
  if (replica_ && mode == Mode::kTrain && last_micro_) {
    replica_mark_.record(replica_->stream());
    wait_for_comm(replica_mark_, "comm_wait.across_nodes");
  }
  if (loss_queued_) {  // micro_step_queued: the loss stays on the device; finish_gated_step() reads it
    model_->move_loss_sum(optimizer_.loss_slot());
    return 0.0;
  }
  double loss_sum = 0.0;
  if (mode == Mode::kLogits)
    compute_stream_.synchronize();
  else
    loss_sum = model_->take_loss_sum();  // synchronises
  after_sync();
  return loss_sum;
}

template <typename T>
void CudaShardedModel<T>::gather(int unit, size_t at) {
  if (at < next_gather_) return;  // prefetch() issued it
  issue_gather(unit);
  next_gather_ = at + 1;
}

template <typename T>
void CudaShardedModel<T>::head(int unit) {
  if (mode_ == Mode::kLogits) {
    model_->head_logits(gathered(unit), gathered(0), len_ - 1, logits_out_);
  } else if (mode_ == Mode::kEval) {
    model_->head_forward_backward(gathered(unit), gathered(0), targets_, 0.0f, nullptr, nullptr);
  } else {
    T* head_grad = full_grad(unit);
    T* emb_grad = full_grad(0);
    model_->head_forward_backward(gathered(unit), gathered(0), targets_, dloss_, head_grad, emb_grad);
  }
}

// Once the compute stream has synchronised: the stalls' times, and the GEMM tuning's note when new shapes were timed.
template <typename T>
void CudaShardedModel<T>::after_sync() {
  stalls_.collect();
  const gpu::Blas::TuningStats& t = blas_.tuning_stats();
  if (t.plans != gemm_timed_logged_) {  // rank 0 timed new shapes in this run
    gemm_timed_logged_ = t.plans;
    ST_LOG_INFO("GEMM tuning (train.gemm_autotune=", gemm_candidates_, "): ", t.plans,
                " shapes timed; one call of each takes ", std::round(t.first_ms * 1000) / 1000,
                " ms with cuBLASLt's first choice, ", std::round(t.chosen_ms * 1000) / 1000,
                " ms with the fastest of its list (every rank takes it)");
  }
}

template <typename T>
void CudaShardedModel<T>::use_gemm_algorithms(const GemmAlgorithms& a) {
  const int64_t library = static_cast<int64_t>(cublasLtGetVersion());
  if (a.device != device_name_ || a.library != library) {
    if (comm_.rank() == 0)
      ST_LOG_INFO("GEMM algorithms: the checkpoint's were picked on ", a.device, " with cuBLASLt ", a.library,
                  "; this is ", device_name_, " with ", library,
                  ": picking anew (the bits may differ from the run that wrote the checkpoint)");
    return;
  }
  blas_.use_algorithms(a.plans);
  if (comm_.rank() == 0)
    ST_LOG_INFO("GEMM algorithms: ", std::count(a.plans.begin(), a.plans.end(), '\n'),
                " from the checkpoint (picked on ", a.device, " with cuBLASLt ", a.library, ")");
}

// The compute stream waits for `done`, timed (take_exposed_comm_ms), with a row in the op profile.
template <typename T>
void CudaShardedModel<T>::wait_for_comm(const CudaEvent& done, const char* what) {
  OpTimer::Laps lap = model_->timer().laps(compute_stream_.get());
  lap(what);
  stalls_.wait(compute_stream_.get(), done);
}

template <typename T>
void CudaShardedModel<T>::micro_step_queued(const int32_t* inputs, const int32_t* targets, float dloss) {
  ST_CHECK(gates_on_device() && !loss_queued_ && !gate_queued_, "micro_step_queued: ",
           gates_on_device() ? "the last queued step was not finished (finish_gated_step)" : "optimizer offload is on");
  ST_CHECK(micro_steps_left_ <= 1, "micro_step_queued for a micro-step that is not the step's last (",
           micro_steps_left_, " left)");
  loss_queued_ = true;
  try {
    micro_step(inputs, targets, dloss);
  } catch (...) {
    loss_queued_ = false;
    throw;
  }
}

template <typename T>
double CudaShardedModel<T>::micro_step(const int32_t* inputs, const int32_t* targets, float dloss) {
  ST_CHECK(!summed_across_nodes_,
           "micro_step after this step's gradients were summed across nodes: call zero_grads() "
           "and expect_micro_steps() first");
  last_micro_ = --micro_steps_left_ <= 0;
  tokens_ = inputs;
  batch_ = cfg_.train.micro_batch;
  len_ = cfg_.model.seq_len;
  const double loss_sum =
      run(training_schedule(cfg_.model.n_layer, cfg_.dist.reshard_after_forward, /*keep_embedding=*/true), Mode::kTrain,
          targets, dloss);
  fresh_grads_ = false;  // the next micro-step of this step adds to the shards
  // Every buffer of ours is allocated at set-up, but NCCL connects its peers (and allocates their buffers) at
  // the first collectives, and the libraries may allocate on first use: sample after each micro-step.
  sample_device_memory();
  return loss_sum;
}

template <typename T>
double CudaShardedModel<T>::eval_micro(const int32_t* inputs, const int32_t* targets) {
  tokens_ = inputs;
  batch_ = cfg_.train.micro_batch;
  len_ = cfg_.model.seq_len;
  return run(eval_schedule(cfg_.model.n_layer, /*keep_embedding=*/true), Mode::kEval, targets, 0.0f);
}

template <typename T>
void CudaShardedModel<T>::last_logits(const int32_t* tokens, int64_t len, std::vector<float>* logits) {
  tokens_ = tokens;
  batch_ = 1;
  len_ = len;
  logits_out_ = logits;
  run(eval_schedule(cfg_.model.n_layer, /*keep_embedding=*/true), Mode::kLogits, nullptr, 0.0f);
  logits_out_ = nullptr;
}

template <typename T>
double CudaShardedModel<T>::grad_sum_of_squares() {
  // With every unit's share taken as its gradient became final (finish_grad), the compute stream has waited for
  // those streams (run()); else the shards are read here. The same bits either way.
  std::vector<typename DeviceOptimizer<T>::GradView> grads;
  for (int u = 0; u < static_cast<int>(shards_->size()); ++u)
    grads.push_back({shards_->grad(u).data(), shards_->view(u).span.count});
  return optimizer_.sum_of_squares(grads, ctx_);
}

template <typename T>
void CudaShardedModel<T>::check_runs(int unit, const std::vector<AdamWRun>& runs) const {
  const int64_t owned = shards_->view(unit).span.count;
  for (const AdamWRun& r : runs)
    ST_CHECK(r.offset >= 0 && r.offset + r.count <= owned, "AdamW run [", r.offset, ", +", r.count, ") outside unit ",
             unit, "'s span of ", owned);
}

template <typename T>
void CudaShardedModel<T>::adamw(int unit, const std::vector<AdamWRun>& runs) {
  check_runs(unit, runs);
  if (offload(unit)) {
    // Queued on the host AdamW; the offload stream waits for it and copies the new shard up, and the next gather of
    // this unit waits for that. This thread goes on to the next unit, then to the next step.
    offload_->update(unit, runs, shards_->grad(unit), final_grad_stream());
    if (unit == 0 && !embedding_prefetched_) prefetch_embedding();
    return;
  }
  device_adamw(unit, runs, nullptr);
}

// On the optimizer stream, after what the compute stream has queued (the step's final gradients, their norm, the
// gate), so that the next step's forward starts once unit 0 is updated and gathered, while the other units update.
template <typename T>
void CudaShardedModel<T>::device_adamw(int unit, const std::vector<AdamWRun>& runs, const StepGate* gate) {
  if (unit < static_cast<int>(snapshot_fence_.size()) && snapshot_fence_[static_cast<size_t>(unit)]) {
    snapshot_copied_[static_cast<size_t>(unit)].wait_on(optimizer_.stream());  // the snapshot has this unit's state
    snapshot_fence_[static_cast<size_t>(unit)] = false;
  }
  optimizer_.update(unit, shards_->optimizer_state(unit), runs, gate, compute_stream_.get());
  if (unit == 0 && !embedding_prefetched_) prefetch_embedding();
}

// The norm's parts were taken as each gradient became final (finish_grad); summed in order as grad_sum_of_squares
// does, all-reduced with the losses over the sharding group, decided on, and every unit's AdamW queued behind the
// decision.
template <typename T>
void CudaShardedModel<T>::queue_gated_update(double earlier_losses, double loss_scale, float grad_clip,
                                             const std::vector<std::vector<AdamWRun>>& runs) {
  ST_CHECK(loss_queued_ && !gate_queued_, "queue_gated_update without a queued last micro-step");
  ST_CHECK(runs.size() == shards_->size(), "queue_gated_update: runs for ", runs.size(), " units, the model has ",
           shards_->size());
  for (size_t u = 0; u < runs.size(); ++u) check_runs(static_cast<int>(u), runs[u]);
  optimizer_.queue_gate(earlier_losses, loss_scale, grad_clip, coll_.shard(), coll_.replica(), ctx_);
  loss_queued_ = false;
  gate_queued_ = true;
  for (size_t u = 0; u < shards_->size(); ++u) device_adamw(static_cast<int>(u), runs[u], optimizer_.gate());
}

template <typename T>
ModelBackend::GatedStep CudaShardedModel<T>::finish_gated_step() {
  ST_CHECK(gate_queued_, "finish_gated_step without queue_gated_update");
  gate_queued_ = false;
  GatedStep g;
  g.gate = optimizer_.finish_gate(&g.last_loss_sum);  // the decision, not the AdamW behind it
  after_sync();
  return g;
}

template <typename T>
std::vector<float> CudaShardedModel<T>::gather_full(int unit, bool grads) {
  const UnitShard& h = shards_->view(unit);
  cudaStream_t cs = compute_stream_.get();
  optimizer_.synchronize();  // the master as the last AdamW left it
  DeviceBuffer<float> full(h.slot * coll_.shard().world_size());
  DeviceBuffer<float> host_master;  // optim.offload: the master is on the host
  const float* source = grads ? shards_->grad(unit).data() : shards_->master(unit);
  if (!grads && offload(unit)) {
    const UnitShard& state = offload_->state(unit);
    host_master = DeviceBuffer<float>(h.slot);
    ST_CUDA_CHECK(
        cudaMemcpyAsync(host_master.data(), state.param.data(), host_master.bytes(), cudaMemcpyHostToDevice, cs));
    source = host_master.data();
  }
  coll_.shard().all_gather<float>(source, h.slot, full.data(), cs);
  std::vector<float> out(static_cast<size_t>(full.size()));
  ST_CUDA_CHECK(cudaMemcpyAsync(out.data(), full.data(), full.bytes(), cudaMemcpyDeviceToHost, cs));
  compute_stream_.synchronize();
  out.resize(static_cast<size_t>(units_[static_cast<size_t>(unit)].numel));
  return out;
}

template <typename T>
void CudaShardedModel<T>::pull_state() {
  compute_stream_.synchronize();
  optimizer_.synchronize();
  comm_stream_.synchronize();
  if (replica_) ST_CUDA_CHECK(cudaStreamSynchronize(replica_->stream()));
  for (int u = 0; u < static_cast<int>(shards_->size()); ++u) {
    if (!offload(u)) {
      shards_->pull(u);
      continue;
    }
    // Param, m and v are on the host already; the gradient is on the device.
    UnitShard& state = offload_->state(u);
    const DeviceBuffer<float>& g = shards_->grad(u);
    state.grad.resize(static_cast<size_t>(state.slot));
    ST_CUDA_CHECK(cudaMemcpy(state.grad.data(), g.data(), g.bytes(), cudaMemcpyDeviceToHost));
  }
}

// Device-resident units are copied into pinned memory on a stream of their own, behind this step's AdamW (an event
// on the optimizer stream), last unit first: the order in which the next step's backward finishes them. Each unit's
// next AdamW waits for its own copy alone (device_adamw), so the copy engine moves the state while the next step's
// forward and backward run. Offloaded units live in host memory already: they are copied once the host AdamW is done.
template <typename T>
void CudaShardedModel<T>::reserve_snapshot(StateSnapshot* snap) {
  int64_t floats = 0;
  for (int u = 0; u < static_cast<int>(shards_->size()); ++u) floats += 3 * shard(u).span.count;
  if (snap->capacity >= floats) return;
  snap->storage.reset();
  float* p = nullptr;
  ST_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p), static_cast<size_t>(floats) * sizeof(float)));
  snap->storage = std::shared_ptr<float>(p, [](float* q) { cudaFreeHost(q); });
  snap->capacity = floats;
}

template <typename T>
void CudaShardedModel<T>::snapshot_state(StateSnapshot* snap) {
  reserve_snapshot(snap);
  if (snapshot_copier_.valid()) snapshot_copier_.wait();  // the last snapshot's host copies are done
  if (offload_) offload_->wait_all();                     // this step's host updates too
  const int n_units = static_cast<int>(shards_->size());
  snapshot_copied_.resize(static_cast<size_t>(n_units));
  snapshot_fence_.assign(static_cast<size_t>(n_units), false);
  cudaStream_t cs = snapshot_stream_.get();
  snapshot_after_.record(optimizer_.stream());
  snapshot_after_.wait_on(cs);
  snap->units.assign(static_cast<size_t>(n_units), StateSnapshot::Unit{});
  float* at = snap->storage.get();
  for (int u = 0; u < n_units; ++u) {
    const UnitShard& view = shard(u);
    const int64_t n = view.span.count;
    snap->units[static_cast<size_t>(u)] = {units_[static_cast<size_t>(u)].name, view.span, at, at + n, at + 2 * n};
    at += 3 * n;
  }
  // Host-resident units: copied by a thread of the snapshot's own, in the order the next step submits their host
  // updates (the backward's with speculation, else unit order), each update held until its unit is copied.
  struct HostCopy {
    int unit;
    const float* src[3];
    float* dst;
    int64_t n;
  };
  std::vector<HostCopy> host;
  auto copied = std::make_shared<std::vector<std::atomic<bool>>>(static_cast<size_t>(n_units));
  for (int u = n_units - 1; u >= 0; --u) {
    const StateSnapshot::Unit& su = snap->units[static_cast<size_t>(u)];
    float* dst = const_cast<float*>(su.param);
    (*copied)[static_cast<size_t>(u)].store(!offload(u), std::memory_order_relaxed);
    if (offload(u)) {
      const UnitShard& view = shard(u);
      host.push_back({u, {view.param.data(), view.m.data(), view.v.data()}, dst, su.span.count});
      continue;
    }
    const size_t bytes = static_cast<size_t>(su.span.count) * sizeof(float);
    const typename DeviceOptimizer<T>::UnitState d = shards_->optimizer_state(u);
    ST_CUDA_CHECK(cudaMemcpyAsync(dst, d.master, bytes, cudaMemcpyDeviceToHost, cs));
    ST_CUDA_CHECK(cudaMemcpyAsync(dst + su.span.count, d.m, bytes, cudaMemcpyDeviceToHost, cs));
    ST_CUDA_CHECK(cudaMemcpyAsync(dst + 2 * su.span.count, d.v, bytes, cudaMemcpyDeviceToHost, cs));
    snapshot_copied_[static_cast<size_t>(u)].record(cs);
    snapshot_fence_[static_cast<size_t>(u)] = true;
  }
  std::shared_future<void> copier;
  if (!host.empty()) {
    if (!offload_->speculates()) std::reverse(host.begin(), host.end());
    offload_->hold_updates_until(copied);
    copier = std::async(std::launch::async, [host = std::move(host), copied] {
               for (const HostCopy& h : host) {
                 for (int k = 0; k < 3; ++k) std::copy_n(h.src[k], h.n, h.dst + k * h.n);
                 (*copied)[static_cast<size_t>(h.unit)].store(true, std::memory_order_release);
               }
             }).share();
    snapshot_copier_ = copier;
  }
  auto device_copied = std::make_shared<CudaEvent>();
  device_copied->record(cs);
  int device = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  snap->ready = [device_copied, copier, device] {
    if (copier.valid()) copier.wait();
    ST_CUDA_CHECK(cudaSetDevice(device));  // the waiting thread may be another than the one that trains
    device_copied->synchronize();
  };
}

template <typename T>
void CudaShardedModel<T>::push_state() {
  if (embedding_prefetched_) {  // gathered from the shard this replaces
    release_params(0);
    embedding_prefetched_ = false;
  }
  if (offload_) {
    offload_->wait_all();
    offload_->synchronize();
  }
  if (snapshot_copier_.valid()) snapshot_copier_.wait();
  // Nothing in flight may still write the buffers replaced here, nor read them for a snapshot.
  for (const CudaStream* st : {&compute_stream_, &comm_stream_, &snapshot_stream_}) st->synchronize();
  if (replica_) ST_CUDA_CHECK(cudaStreamSynchronize(replica_->stream()));
  optimizer_.synchronize();
  for (int u = 0; u < static_cast<int>(shards_->size()); ++u) {
    if (offload(u))
      offload_->push(u);  // the host state is the state: only the compute copy follows it
    else
      shards_->push(u, ctx_);
  }
  compute_stream_.synchronize();
}

template <typename T>
MemoryStats CudaShardedModel<T>::memory() const {
  MemoryStats m;
  m.sharded_state_bytes = plan_.sharded_state;
  m.padding_elements = shards_->padding_elements();
  m.gather_buffer_bytes = plan_.gather_buffers;
  m.gathered_peak_bytes = buffers_->peak_bytes();
  m.activation_bytes = plan_.activations;
  m.workspace_bytes = plan_.workspace;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) m.device_in_use_bytes = static_cast<int64_t>(total_b - free_b);
  return m;
}

}  // namespace

std::unique_ptr<ModelBackend> make_cuda_sharded_model(const Config& cfg, Communicator& comm) {
  switch (cfg.compute_dtype()) {
    case DType::kF32:
      return std::make_unique<CudaShardedModel<float>>(cfg, comm);
    case DType::kBF16:
      return std::make_unique<CudaShardedModel<bf16>>(cfg, comm);
    case DType::kF16:
      return std::make_unique<CudaShardedModel<fp16>>(cfg, comm);
    case DType::kAuto:
      break;
  }
  ST_CHECK(false, "compute_dtype() returned auto");
  return nullptr;
}

}  // namespace st
