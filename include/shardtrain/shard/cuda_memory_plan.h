// memory_plan.h on a CUDA device: what the family's CUDA model (cuda_family.h) and the libraries need at the training
// shape, the device's free memory, the plan checked against them, and what dist.sharding=auto weighs.
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/shard/memory_plan.h"
#include "shardtrain/shard/sharding.h"

namespace st {

// The CUDA model's activations and kernel scratch (at least attention_scratch_bytes), cuBLASLt's workspace and the
// reduction scratch, for cfg's micro-batch and recompute setting.
template <typename T>
ComputeFootprint cuda_compute_footprint(const Config& cfg, int64_t attention_scratch_bytes);

// The current device's free memory (cudaMemGetInfo).
int64_t device_free_bytes();

// The plan for `world` ranks, or kBadInput with its breakdown if it exceeds dist.max_gpu_mem_gib or the device's free
// memory. Runs before the large allocations: the cap stands in for a smaller card.
template <typename T>
MemoryPlan checked_cuda_plan(const Config& cfg, int world, const CommPlan& comm, const std::string& device,
                             int64_t attention_scratch_bytes);

// What dist.sharding=auto weighs on GPUs for cfg.compute_dtype(): links measured through NCCL, the memory plan
// against the cap or the free memory (sharding.h). `cfg` must outlive the result.
AutoShardingInputs cuda_auto_sharding_inputs(const Config& cfg, const Communicator& comm);

}  // namespace st
