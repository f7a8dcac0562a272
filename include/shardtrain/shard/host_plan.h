// The host memory a CUDA rank will hold, planned before anything large is allocated, and checked against what the
// host, its cgroup and the process's rlimits allow (process_memory.h), summed over the ranks that share the host.
// Host code: the CPU tests check every term, and `shardtrain plan` prints it without a GPU.
//
//   const HostPlan plan = plan_cuda_host(cfg, world, /*speculated=*/0);
//   check_cuda_host_plan(cfg, world, budget, local_ranks);  // kBadInput with the breakdown and what to change
//
// Per rank, with S_u = padded_shard_size(numel_u, world) and t the compute type's size:
//   optimizer state    12 S_u for each unit optim.offload moves to the host (fp32 master, AdamW m and v)
//   staging            pinned memory that carries gradient shards down and the host AdamW's results up: for the units
//                      that do not speculate, the staging ring (staging_ring.h: two of the largest such unit's
//                      4 S_u + t S_u, or 4 S_u with optimizer+params); for each speculated unit, a gradient and a
//                      result buffer of its own (4 S_u + t S_u)
//   host parameters    optim.offload=optimizer+params: the pinned compute-type parameters that gathers read (t S_u
//                      per offloaded unit that does not speculate; a speculated unit's result buffer is its copy)
//   speculative copy   12 S_u per speculated unit (optim.offload_speculative: the last offloaded units, from the head
//                      back, whose gradients are final first in the backward)
//   snapshot           ckpt.async with ckpt.dir: 12 S_u per device-resident unit in pinned memory (param, m, v,
//                      copied beside the next step); offloaded units are written from the host state itself
//   loading            random initialisation fills one shard at a time (4 S_u of the largest unit); init.from, a
//                      checkpoint load and a synchronous save stream the device-resident units through the host one
//                      at a time: the view of one unit's param, m and v (12 S_u of the largest device-resident unit)
//                      and the file I/O's buffers (kStreamingIoBytes); the larger of the two
//   export             ckpt.export at the end of the run (export_host_bytes); never beside loading, so the larger of
//                      the two counts
//   reserve            the CUDA runtime, NCCL, cuBLASLt, the data pipeline and the threads (kCudaHostReserveBytes)
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/process_memory.h"

namespace st {

// A fixed allowance per rank for what the CUDA runtime, NCCL's host buffers, cuBLASLt, the data pipeline, the host
// AdamW's threads and the allocator's arenas hold beside the plan's buffers.
inline constexpr int64_t kCudaHostReserveBytes = int64_t{3} << 30;

// What a streamed checkpoint load or save holds beside the unit in hand: the load's pass over a file (three 64 MiB
// reads in flight) and the bytes it carries from one unit to the next (under a 16 MiB digest piece), or the writer's
// four 16 MiB buffers and its carried piece; rounded up. A load of a checkpoint written by more ranks reads several
// files, and carries up to 16 MiB for each of them beyond the first, 64 files at most at once (the plan does not know
// that world size).
inline constexpr int64_t kStreamingIoBytes = int64_t{256} << 20;

// The host memory of the largest unit gathered whole in fp32 at `world` ranks (StepEngine::gather_unit: a unit with
// both parts joins its trained and frozen ones into one buffer, 8 bytes an element while they join) and, with LoRA,
// merged into the base's layout beside it (4 bytes an element of the base's unit). ckpt.export and the end-of-run
// sample on cuda hold it, a unit at a time.
int64_t gathered_unit_host_bytes(const Config& cfg, int world);

// ckpt.export's host memory on each rank at the end of a run (0 without ckpt.export): every rank gathers each unit in
// turn, and the lead merges it and writes it through the writer's buffers (kStreamingIoBytes). Both backends' plans
// count it.
int64_t export_host_bytes(const Config& cfg, int world);

struct HostPlan {
  int64_t optimizer_state = 0;
  int64_t staging = 0;
  int64_t host_parameters = 0;
  int64_t speculative = 0;
  int64_t snapshot = 0;
  int64_t loading = 0;
  int64_t export_unit = 0;
  int64_t reserve = kCudaHostReserveBytes;
  int offloaded_units = 0, speculated_units = 0;  // speculated_units of the offloaded_units have the second copy
  int64_t total() const {
    return optimizer_state + staging + host_parameters + speculative + snapshot + std::max(loading, export_unit) +
           reserve;
  }
  std::string breakdown() const;  // "optimizer state 89.75 GiB, staging 5.87 GiB, ..., total ..."
};

// A count of speculated units that means every offloaded unit.
inline constexpr int kEveryOffloadedUnit = std::numeric_limits<int>::max();

// The units that speculate: the last `count` of the offloaded ones, from the head back (the backward finishes their
// gradients first, so their host AdamW has the most of it to overlap).
std::vector<bool> speculated_units(const std::vector<bool>& offloaded, int count);

// The host plan of one CUDA rank for cfg sharded over `world` ranks, with the speculative copy for `speculated` of
// the offloaded units (speculated_units; 0: none, kEveryOffloadedUnit: all).
HostPlan plan_cuda_host(const Config& cfg, int world, int speculated);

// optim.offload_speculative resolved to the number of offloaded units that speculate: true all, false none, auto as
// many as the budget holds with their second copies (all, some or none; then planned, and used, for the whole run).
int resolve_speculation(const Config& cfg, int world, const HostMemoryBudget& budget);

// kBadInput when the plan (with the speculation resolve_speculation picks) exceeds the budget of one of the
// `local_ranks` ranks on this host: the breakdown, the limit that binds, and the changes that would make it fit.
// Returns the plan otherwise.
HostPlan check_cuda_host_plan(const Config& cfg, int world, const HostMemoryBudget& budget, int local_ranks);

}  // namespace st
