// The memory plan of a whole run, before it starts and without a GPU: per rank, the device plan (memory_plan.h) and
// the host plan (host_plan.h for train.device=cuda, plan_host_memory for cpu), each against its budget. Start-up
// checks these same plans (cuda_memory_plan.h, sharded_model.cc), and `shardtrain plan` prints them, so the two can
// never disagree: a config `plan` says fits passes the start-up checks on the same budgets, and one it refuses is
// refused there with exit code 2.
//
//   RunTarget t;                                   // 2 ranks on one node, 24 GiB cards, 64 GiB of host memory
//   t.world = 2;
//   t.ranks_per_node = 2;
//   t.device = DeviceBudget::of(cfg, int64_t{24} << 30);
//   t.host = HostMemoryBudget{int64_t{32} << 30, "..."};
//   const RunPlan p = plan_run(cfg, t);            // p.fits(), p.device_plan.breakdown(), p.host_breakdown()
//
// The link between the GPUs is not known before the sharding is (it sets the default prefetch depth and whether the
// reduce-scatters run on the copy engines), so the CUDA plan takes the largest: the deepest default prefetch depth
// (or dist.prefetch_depth where set), and the copy engines' whole-unit reduce-scatter output wherever they may run
// (a sharding group of several ranks on one node, dist.reduce_engine not sm). What the run allocates once its link is
// known is never more. Attention's kernel scratch is planned at cudnn_attention_scratch_bound where cuDNN may run it.
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/process_memory.h"
#include "shardtrain/shard/host_plan.h"
#include "shardtrain/shard/memory_plan.h"
#include "shardtrain/shard/step_traffic.h"

namespace st {

// Where the run would go.
struct RunTarget {
  int world = 1;                        // ranks
  int ranks_per_node = 1;               // ranks sharing one host (its memory, its GPUs)
  DeviceBudget device;                  // cuda: what one rank may plan on its GPU
  std::string device_name = "the GPU";  // for messages
  HostMemoryBudget host;                // what one rank may plan on its host (already split between the node's ranks)
};

// This run as `shardtrain plan` would target it: comm's ranks, those on this host (device_ranks), and this host's
// memory split between them under dist.max_host_mem_gib. The device budget is left to the caller (start-up reads the
// GPU's free memory once it is bound).
RunTarget run_target(const Config& cfg, const Communicator& comm, const std::string& device_name = "the GPU");

// The ranks a unit is sharded over: ranks_per_node with dist.sharding=hybrid over several nodes, else the world
// (dist.sharding=auto is planned as full sharding, which it picks unless measured links favour hybrid).
int planned_shard_world(const Config& cfg, int world, int ranks_per_node);

// Hybrid sharding's bucket of gradient shards (elements of elem_bytes) as they cross nodes: ReplicaBuckets's capacity
// at dist.bucket_mb (or its default).
int64_t replica_bucket_elements(const Config& cfg, int shard_world, int64_t elem_bytes);

// The communication plan a CUDA rank is planned with before its link is known (above).
CommPlan unknown_link_comm_plan(const Config& cfg, int shard_world, bool hybrid);

// The kernel scratch planned for attention: cudnn_attention_scratch_bound at the training shape where cuDNN may run
// (train.attention=cudnn, or auto in bf16/fp16 with a head size that is a multiple of 8), else 0 (flash attention's
// scratch is part of the model's own).
int64_t attention_scratch_bound(const Config& cfg);

// The CUDA model's activations and kernel scratch (at least attention_scratch_bytes), cuBLASLt's workspace and the
// reduction scratch, for cfg's compute type, micro-batch and recompute setting.
ComputeFootprint cuda_compute_footprint(const Config& cfg, int64_t attention_scratch_bytes);

// The device plan of one CUDA rank sharded over shard_world ranks (hybrid: with one replica per node), as planned
// before the link is known. Start-up checks this plan against the device's budget.
MemoryPlan planned_cuda_device(const Config& cfg, int shard_world, bool hybrid);

// What bounds one rank's memory for cfg.train.device: planned_cuda_device on cuda (device memory), plan_host_memory on
// cpu (host memory).
MemoryPlan planned_rank_memory(const Config& cfg, int shard_world, bool hybrid);

struct RunPlan {
  Device device = Device::kCpu;
  int shard_world = 1;
  bool hybrid = false;
  // cuda: the device plan against RunTarget::device; cpu: none (device_fits is true).
  MemoryPlan device_plan;
  bool device_fits = true;
  // cuda: plan_cuda_host with the speculation resolve_speculation picks (cuda_host.speculated_units); cpu:
  // plan_host_memory.
  HostPlan cuda_host;
  MemoryPlan cpu_host;
  int64_t host_total() const { return device == Device::kCuda ? cuda_host.total() : cpu_host.total(); }
  std::string host_breakdown() const { return device == Device::kCuda ? cuda_host.breakdown() : cpu_host.breakdown(); }
  bool host_fits = true;
  bool fits() const { return device_fits && host_fits; }
  // What one rank's collectives move in a step (step_traffic.h): memory is not all a plan should say.
  StepTraffic traffic;
};

// cfg's plan on `target`. Throws kBadInput only for a config the plan cannot describe (a global batch that does not
// divide over the world, a model whose size overflows the plan's arithmetic).
RunPlan plan_run(const Config& cfg, const RunTarget& target);

}  // namespace st
