// ZeRO-3 on GPUs: the CUDA implementation of ModelBackend. One process per GPU; the same units, spans
// and schedule (schedule.h) as the CPU ShardedModel, with device memory, NCCL and two streams.
//
// Per rank and unit u (S_u = padded_shard_size(numel_u, N)), device memory holds the fp32 master
// shard, gradient accumulator and AdamW m and v (16 S_u bytes), plus, in bf16 mode, the bf16 copy of
// the master shard that gathers read (2 S_u bytes; AdamW writes it). Gathered parameters and full unit
// gradients are in the compute type, in buffers allocated once:
//   * parameters: a dedicated buffer for unit 0 (the tied embedding, live at both ends of the step) and
//     a pool of two unit-sized buffers (reshard_after_forward = true) or one per unit (false);
//   * gradients: one for unit 0 and two unit-sized buffers.
//
// Overlap: collectives run on a communication stream, compute on a compute stream, ordered by events.
// While unit u computes, the gather of the next unit in the schedule is already issued (its buffer is
// free once the unit that held it has been released); the reduce-scatter of u's gradient (then its
// accumulation into the fp32 shard) runs while u-1's backward computes.
//
// Optimizer offload (optim.offload, optim.offload_fraction): for the offloaded units (the last ones in forward
// order) the fp32 master and AdamW moments live in host memory (host_[u], the checkpoint view) and AdamW runs on
// HostAdamW's threads. During the step's last micro-step each offloaded unit's finished gradient shard is copied
// to pinned host memory on a D2H stream as soon as its reduce-scatter has been accumulated, behind the rest of the
// backward. adamw(u) queues the host job and returns; a host function on the offload stream waits for it, then
// the new T shard is copied up (optimizer) or kept in pinned memory and copied into a staging buffer just
// before each gather (optimizer+params). The next forward's gather of u waits for that on the GPU, never on the
// trainer's thread. The update needs the global gradient norm (clipping, the finite check), so it starts once
// the backward is done and overlaps the next forward; host AdamW and GPU AdamW give the same bits.
//
// Memory is planned before anything is allocated: if the plan exceeds dist.max_gpu_mem_gib, or the
// device's free memory, construction throws kBadInput with the breakdown (sharded state, gather
// buffers, activations, workspace).
#pragma once

#include <memory>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/shard/model_backend.h"
#include "shardtrain/shard/sharding.h"

namespace st {

// Bytes a CUDA rank needs, by kind, for a config and world size (the numbers construction checks).
struct CudaMemoryPlan {
  int64_t sharded_state = 0;
  int64_t gather_buffers = 0;
  int64_t activations = 0;
  int64_t workspace = 0;
  int64_t total() const { return sharded_state + gather_buffers + activations + workspace; }
  std::string breakdown() const;  // "sharded state 1.23 GiB, gather buffers ..., total ..."
};

// Creates the backend for cfg.compute_dtype() (fp32 or bf16). Collective over `comm` (NCCL bootstrap).
std::unique_ptr<ModelBackend> make_cuda_sharded_model(const Config& cfg, Communicator& comm);

// What dist.sharding=auto weighs on GPUs for cfg.compute_dtype(): links measured through NCCL, the memory plan
// against the cap or the free memory (sharding.h). `cfg` must outlive the result.
AutoShardingInputs cuda_auto_sharding_inputs(const Config& cfg, const Communicator& comm);

}  // namespace st
