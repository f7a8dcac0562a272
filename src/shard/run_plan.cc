#include "shardtrain/shard/run_plan.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/scratch_sizes.h"
#include "shardtrain/model/cuda_footprint.h"
#include "shardtrain/model/recompute.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/comm_tuning.h"
#include "shardtrain/shard/shard_span.h"

namespace st {

int planned_shard_world(const Config& cfg, int world, int ranks_per_node) {
  const bool several_nodes = ranks_per_node > 0 && world > ranks_per_node;
  return cfg.dist.sharding == ShardingMode::kHybrid && several_nodes ? ranks_per_node : world;
}

int64_t replica_bucket_elements(const Config& cfg, int shard_world, int64_t elem_bytes) {
  std::vector<int64_t> slots;
  for (const UnitLayout& u : build_units(cfg.model)) slots.push_back(padded_shard_size(u.numel, shard_world));
  int64_t bucket_bytes = default_comm_tuning(LinkKind::kNetwork).bucket_bytes;
  if (cfg.dist.bucket_mb >= 0) bucket_bytes = static_cast<int64_t>(cfg.dist.bucket_mb * double(int64_t{1} << 20));
  return ReplicaBuckets(std::move(slots), bucket_bytes / elem_bytes).capacity();
}

CommPlan unknown_link_comm_plan(const Config& cfg, int shard_world, bool hybrid) {
  CommPlan c;
  c.prefetch_depth = 0;
  for (LinkKind k : {LinkKind::kNvlink, LinkKind::kPcie, LinkKind::kNetwork})
    c.prefetch_depth = std::max(c.prefetch_depth, default_comm_tuning(k).prefetch_depth);
  if (cfg.dist.prefetch_depth >= 0) c.prefetch_depth = static_cast<int>(cfg.dist.prefetch_depth);
  // The copy engines reduce-scatter over NVLink inside one node, unless dist.reduce_engine=sm or a CTA cap asks for
  // NCCL's kernels (resolve_comm_tuning).
  const bool copy_allowed = cfg.dist.reduce_engine == CommEngine::kCopy ||
                            (cfg.dist.reduce_engine == CommEngine::kAuto && cfg.dist.reduce_scatter_ctas < 0);
  c.exchange_reduce = shard_world > 1 && copy_allowed;
  if (hybrid) c.replica_bucket_elements = replica_bucket_elements(cfg, shard_world, dtype_bytes(cfg.compute_dtype()));
  return c;
}

int64_t attention_scratch_bound(const Config& cfg) {
  const ModelConfig& m = cfg.model;
  const AttentionImpl impl = cfg.train.attention;
  if (impl == AttentionImpl::kFlash) return 0;
  // auto takes flash where cuDNN cannot run: fp32, and head sizes that are not a multiple of 8.
  if (impl == AttentionImpl::kAuto && (cfg.compute_dtype() == DType::kF32 || m.head_dim() % 8 != 0)) return 0;
  return static_cast<int64_t>(gpu::cudnn_attention_scratch_bound(static_cast<int>(cfg.train.micro_batch), m.seq_len,
                                                                 m.n_head, m.kv_heads(), m.head_dim()));
}

ComputeFootprint cuda_compute_footprint(const Config& cfg, int64_t attention_scratch_bytes) {
  const CudaModelFootprint f = cuda_model_footprint(cfg.model, cfg.train.micro_batch, recompute_of(cfg.train),
                                                    cfg.compute_dtype(), attention_scratch_bytes, cfg.train.fp8);
  ComputeFootprint c;
  c.activation_bytes = f.activation_bytes;
  // + the communication stream's scratch, the FP8 casts' scales and maxima (train.fp8; their codes sit in the kernel
  // scratch), and a unit's gather to the host (its pieces)
  c.workspace_bytes = f.scratch_bytes + static_cast<int64_t>(gpu::kBlasWorkspaceBytes) +
                      static_cast<int64_t>(gpu::reduce_scratch_bytes()) +
                      cuda_linear_workspace_bytes(cfg.model, cfg.train.micro_batch * cfg.model.seq_len, cfg.train.fp8,
                                                  cfg.train.fp8_amax_history) +
                      2 * kGatherPieceBytes;
  return c;
}

MemoryPlan planned_cuda_device(const Config& cfg, int shard_world, bool hybrid) {
  return plan_memory(cfg, shard_world, unknown_link_comm_plan(cfg, shard_world, hybrid),
                     cuda_compute_footprint(cfg, attention_scratch_bound(cfg)));
}

MemoryPlan planned_rank_memory(const Config& cfg, int shard_world, bool hybrid) {
  if (cfg.train.device == Device::kCuda) return planned_cuda_device(cfg, shard_world, hybrid);
  return plan_host_memory(cfg, shard_world, hybrid ? replica_bucket_elements(cfg, shard_world, sizeof(float)) : 0);
}

RunTarget run_target(const Config& cfg, const Communicator& comm, const std::string& device_name) {
  RunTarget t;
  t.world = comm.world_size();
  t.ranks_per_node = comm.device_ranks();
  t.device_name = device_name;
  t.host = host_memory_budget(host_memory_limits(), comm.device_ranks(), cfg.dist.max_host_mem_gib);
  return t;
}

RunPlan plan_run(const Config& cfg, const RunTarget& t) {
  ST_CHECK(t.world >= 1 && t.ranks_per_node >= 1, "plan_run: world ", t.world, ", ranks per node ", t.ranks_per_node);
  cfg.grad_accum_steps(t.world);  // kBadInput naming the three numbers where the global batch does not divide
  RunPlan p;
  p.device = cfg.train.device;
  p.shard_world = planned_shard_world(cfg, t.world, t.ranks_per_node);
  p.hybrid = p.shard_world < t.world;
  if (p.device == Device::kCuda) {
    p.device_plan = planned_cuda_device(cfg, p.shard_world, p.hybrid);
    p.device_fits = p.device_plan.total() <= t.device.usable();
    p.cuda_host = plan_cuda_host(cfg, p.shard_world, resolve_speculation(cfg, p.shard_world, t.host));
  } else {
    // Refuses, as start-up does, a model whose size overflows the plan's arithmetic; no budget binds here.
    check_host_memory_plan(cfg, p.shard_world,
                           p.hybrid ? replica_bucket_elements(cfg, p.shard_world, sizeof(float)) : 0,
                           HostMemoryBudget{std::numeric_limits<int64_t>::max(), "no limit"});
    p.cpu_host = planned_rank_memory(cfg, p.shard_world, p.hybrid);
  }
  p.host_fits = p.host_total() <= t.host.bytes;
  p.traffic = step_traffic(cfg, t.world, p.shard_world, p.hybrid);
  return p;
}

}  // namespace st
