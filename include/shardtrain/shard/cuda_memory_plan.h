// memory_plan.h on a CUDA device: the device's free memory, the run's plan (run_plan.h) checked against it at
// start-up, and what dist.sharding=auto weighs.
#pragma once

#include <cstdint>
#include <string>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/shard/memory_plan.h"
#include "shardtrain/shard/run_plan.h"
#include "shardtrain/shard/sharding.h"

namespace st {

// The current device's free memory (cudaMemGetInfo).
int64_t device_free_bytes();
// Device 0's free memory where a CUDA device is visible, else -1 (`shardtrain plan`'s default GPU budget).
int64_t visible_device_free_bytes();

// Start-up's check: kBadInput with its breakdown when the run's plan (planned_cuda_device over `world` sharding ranks:
// the plan `shardtrain plan` prints) exceeds dist.max_gpu_mem_gib or the device's free memory, with the smallest
// change that fits `run` (its ranks, ranks per node and host budget; its device budget is taken here), as `plan`
// finds it. Runs before the large allocations: the cap stands in for a smaller card. Returns what the rank allocates
// now that its link is known (`comm`) and cuDNN has sized its attention scratch: never more than the checked plan. An
// attention scratch above attention_scratch_bound (a cuDNN that asks for more than the documented bound) is refused,
// naming train.attention=flash.
MemoryPlan checked_cuda_plan(const Config& cfg, int world, bool hybrid, const CommPlan& comm, RunTarget run,
                             int64_t attention_scratch_bytes);

// What dist.sharding=auto weighs on GPUs for cfg.compute_dtype(): links measured through NCCL, the run's plan
// against the cap or the free memory (sharding.h). `cfg` must outlive the result.
AutoShardingInputs cuda_auto_sharding_inputs(const Config& cfg, const Communicator& comm);

}  // namespace st
