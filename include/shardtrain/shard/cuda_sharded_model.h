// ZeRO-3 on GPUs: the CUDA implementation of ModelBackend. One process per GPU; the same units, spans and
// schedule (schedule.h, run by schedule_runner.h) as the CPU ShardedModel, with device memory and NCCL.
//
// Per rank and unit, device memory holds the sharded state and full-unit buffers for the gathered parameters and
// gradients in the compute type T (fp32, bf16 or fp16), all allocated once at construction after the memory plan
// (memory_plan.h) has been checked against dist.max_gpu_mem_gib or the device's free memory (kBadInput with the
// breakdown otherwise):
//   * parameters: a dedicated buffer for unit 0 (the tied embedding, live at both ends of the step) and a pool of
//     dist.prefetch_depth + 1 unit-sized buffers (reshard_after_forward = true) or one per unit (false);
//   * gradients: one for unit 0 and prefetch_depth + 1 unit-sized buffers.
//
// Streams: compute (the model's kernels); communication (gathers, reduce-scatters and the accumulation into the
// fp32 gradient shards); optimizer (DeviceOptimizer: AdamW beside the next step's forward); replica (hybrid: the
// all-reduce across nodes); and, with optim.offload, OffloadPipeline's D2H, offload and H2D streams. Events order
// them: while unit u computes, the gathers of the next prefetch_depth units in the schedule are already issued
// (each as soon as its buffer is free); the reduce-scatter of u's gradient runs while u-1's backward computes.
// docs/design.md walks through one step.
#pragma once

#include <memory>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/shard/model_backend.h"

namespace st {

// Creates the backend for cfg.compute_dtype() (fp32, bf16 or fp16). Collective over `comm` (NCCL bootstrap).
std::unique_ptr<ModelBackend> make_cuda_sharded_model(const Config& cfg, Communicator& comm);

}  // namespace st
