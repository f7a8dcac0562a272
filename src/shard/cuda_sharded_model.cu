// CudaShardedModel's construction (memory plan, communicators, buffers allocated once), teardown, memory figures and
// GEMM algorithms, and the factory that picks its compute type.
#include "shardtrain/shard/cuda_sharded_model.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "cuda_sharded_model_impl.h"
#include "shardtrain/comm/gpu_topology.h"
#include "shardtrain/comm/nccl_communicator.h"
#include "shardtrain/core/log.h"
#include "shardtrain/kernels/gpu/fp8_gemm.h"
#include "shardtrain/kernels/gpu/reduce.h"
#include "shardtrain/model/fp8_policy.h"
#include "shardtrain/model/recompute.h"
#include "shardtrain/shard/cuda_memory_plan.h"
#include "shardtrain/shard/run_plan.h"

namespace st {
namespace shard_internal {
namespace {

// train.fp8's policy for the model (Fp8Policy{}: off), refused before anything runs on a GPU without the FP8 GEMMs
// the recipe needs.
Fp8Policy checked_fp8_policy(const Config& cfg, const std::string& device_name) {
  if (cfg.train.fp8 == Fp8Recipe::kOff) return {};
  int device = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  if (!gpu::fp8_gemm_supported(device))
    ST_BAD_INPUT("train.fp8 (", to_string(cfg.train.fp8), ") needs FP8 tensor cores (compute capability 8.9 or ",
                 "higher: Ada, Hopper); ", device_name, " has none: use train.fp8=off");
  if (cfg.train.fp8 == Fp8Recipe::kRowwise && !gpu::fp8_rowwise_gemm_supported(device))
    ST_BAD_INPUT("train.fp8 (rowwise) needs cuBLASLt's per-row FP8 scales, which it has on Hopper (compute ",
                 "capability 9.x) only; ", device_name, " takes train.fp8=tensorwise");
  Fp8Policy fp8 = fp8_policy(cfg.train.fp8, cfg.train.fp8_amax_history);
  fp8.weights_cast = cfg.dist.fp8_gather;  // the gathers deliver the FP8 weights cast (fp8_gatherer.h)
  fp8.forward.fast_accum = cfg.train.fp8_fast_accum;
  return fp8;
}

}  // namespace

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
      target_(run_target(cfg, comm, device_name_)),
      cudnn_(),
      attention_(gpu::choose_attention<T>(
          {cfg.train.attention, cfg.train.deterministic, static_cast<int>(cfg.train.micro_batch), cfg.model.seq_len,
           cfg.model.n_embd, cfg.model.n_head, cfg.model.kv_heads(), cfg.model.head_dim()},
          cudnn_)),
      plan_(checked_cuda_plan(cfg, groups_.shard().world_size(), groups_.replica != nullptr, comm_plan(), target_,
                              attention_.scratch_bytes)),
      host_plan_(check_cuda_host_plan(cfg, groups_.shard().world_size(), target_.host, comm.device_ranks())),
      blas_(),
      scratch_(cuda_model_footprint(cfg.model, cfg.train.micro_batch, recompute_of(cfg.train), cfg.compute_dtype(),
                                    attention_.scratch_bytes, cfg.train.fp8)
                   .scratch_bytes),
      comm_scratch_(static_cast<int64_t>(gpu::reduce_scratch_bytes())),
      ctx_{compute_stream_.get(), &blas_, scratch_.data(), scratch_.bytes(), &cudnn_},
      comm_ctx_{comm_stream_.get(), nullptr, comm_scratch_.data(), comm_scratch_.bytes()},
      model_(cuda_model_family<T>(cfg.model.arch)
                 .make_model(cfg.model, cfg.train.micro_batch, recompute_of(cfg.train), attention_.cudnn, ctx_,
                             attention_.backward, checked_fp8_policy(cfg, device_name_))),
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
  // Units that read their shards in place (units_in_place) leave the parameter buffers' sizes; where all do, those
  // hold no elements and the pools still order the schedule's gathers and releases.
  in_place_ = units_in_place(cfg, units_, world);
  const UnitSizes s = unit_sizes(units_, world, in_place_);
  // The gathers' sources (each unit's shard in T, read on the device) and destinations, in two symmetric windows of
  // the zero-CTA communicator for copy-engine gathers (each buffer its own allocation otherwise).
  int64_t source_bytes = 0;
  for (const UnitLayout& u : units_) {
    if (!params_on_host(u.index)) source_bytes += WindowArena::bytes_for(padded_shard_size(u.numel, world), sizeof(T));
    // The frozen base: its shard in T, or an NF4 unit's words of storage.
    source_bytes += u.nf4_base ? WindowArena::bytes_for(padded_shard_size(nf4_unit_storage(u).words, world), 4)
                               : WindowArena::bytes_for(padded_shard_size(u.frozen_numel, world), sizeof(T));
  }
  WindowArena sources(gather_windows, source_bytes);
  const int64_t pool_size = param_pool_size(cfg, comm_plan());
  WindowArena gathered(gather_windows, WindowArena::bytes_for(s.emb_full, sizeof(T)) +
                                           pool_size * WindowArena::bytes_for(s.unit_full, sizeof(T)) +
                                           WindowArena::bytes_for(s.nf4_full, 4));
  if (s.nf4_full > 0) nf4_full_ = gathered.take<uint8_t>(s.nf4_full * 4);
  if (cfg.dist.fp8_gather) fp8_gather_ = std::make_unique<Fp8Gatherer<T>>(cfg, units_, rank, world);
  typename DeviceShards<T>::Offloaded for_offload;  // optim.offload: the initial state of the units it holds
  shards_ = std::make_unique<DeviceShards<T>>(cfg, units_, rank, world, offloaded,
                                              cfg.optim.offload == OffloadMode::kOptimizerParams, sources, ctx_,
                                              &for_offload);
  // The full gradients and, for copy-engine reduce-scatters, their all-to-all's output: in a third window then.
  const int64_t exchanged = std::max(s.emb_grad_full, s.unit_grad_full);
  WindowArena grads(grad_windows,
                    WindowArena::bytes_for(s.emb_grad_full, sizeof(T)) +
                        grad_pool_size(comm_plan()) * WindowArena::bytes_for(s.unit_grad_full, sizeof(T)) +
                        WindowArena::bytes_for(exchanged, sizeof(T)));
  buffers_ = std::make_unique<UnitBuffers<T>>(static_cast<int>(units_.size()), s.emb_full, s.unit_full, s.emb_grad_full,
                                              s.unit_grad_full, static_cast<int>(pool_size),
                                              grad_pool_size(comm_plan()), gathered, grads);
  if (groups_.replica)
    replica_ = std::make_unique<ReplicaReduction<T>>(shard_slots(), replica_bucket_size(), *coll_.replica());
  // The reduce-scatter's output; at one rank the addition into the shard reads the full gradient itself.
  rs_out_ = coll_.exchange() ? grads.take<T>(exchanged) : DeviceBuffer<T>(world > 1 ? s.max_slot : 0);
  counters_.gathers.assign(units_.size(), 0);
  counters_.reduce_scatters.assign(units_.size(), 0);
  if (cfg.optim.offload != OffloadMode::kNone) {
    typename OffloadPipeline<T>::Options o;
    o.mode = cfg.optim.offload;
    o.speculated_units = host_plan_.speculated_units;
    o.threads = static_cast<int>(cfg.optim.offload_threads);
    o.local_rank = comm.device_rank();  // the machine's CPUs, also under SHARDTRAIN_NODE_ID stand-ins
    o.local_size = comm.device_ranks();
    o.device = coll_.shard().device();
    o.log = comm.rank() == 0;
    offload_ = std::make_unique<OffloadPipeline<T>>(o, offloaded, std::move(for_offload.states),
                                                    std::move(for_offload.copies));
    if (o.log) {
      const HostPlan& h = host_plan_;
      const bool all = h.speculated_units == h.offloaded_units;
      const std::string spec =
          h.speculated_units == 0 ? std::string("off")
          : all                   ? std::string("on")
                : str_cat("the last ", h.speculated_units, " of the ", h.offloaded_units, " offloaded units");
      const char* why = cfg.optim.offload_speculative != Speculation::kAuto ? ""
                        : all                    ? " (the second copy fits the host's budget)"
                        : h.speculated_units > 0 ? " (the second copy of the others would not fit the host's budget)"
                                                 : " (the second copy would not fit the host's budget)";
      ST_LOG_INFO("host memory plan: ", h.breakdown(),
                  " per rank; optim.offload_speculative=", to_string(cfg.optim.offload_speculative), ": ", spec, why);
    }
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

template class CudaShardedModel<float>;
template class CudaShardedModel<bf16>;
template class CudaShardedModel<fp16>;

}  // namespace shard_internal

std::unique_ptr<ModelBackend> make_cuda_sharded_model(const Config& cfg, Communicator& comm) {
  switch (cfg.compute_dtype()) {
    case DType::kF32:
      return std::make_unique<shard_internal::CudaShardedModel<float>>(cfg, comm);
    case DType::kBF16:
      return std::make_unique<shard_internal::CudaShardedModel<bf16>>(cfg, comm);
    case DType::kF16:
      return std::make_unique<shard_internal::CudaShardedModel<fp16>>(cfg, comm);
    case DType::kAuto:
      break;
  }
  ST_CHECK(false, "compute_dtype() returned auto");
  return nullptr;
}

}  // namespace st
