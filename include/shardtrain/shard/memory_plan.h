// The device memory a CUDA rank will hold, planned before anything is allocated: a pure function of the config,
// the sharding group's size, the communication plan and what the compute kernels need (the CUDA model's footprint),
// checked against the device budget (dist.max_gpu_mem_gib, else the device's free memory). Host code: the CPU tests
// check every term.
//
//   const MemoryPlan plan = plan_memory(cfg, world, comm, compute);
//   check_memory_plan(plan, DeviceBudget::of(cfg, free_bytes), "NVIDIA H200");  // kBadInput with the breakdown
//
// Per rank and unit u (S_u = padded_shard_size(numel_u, world)) the sharded state is the fp32 master, gradient,
// AdamW m and v (16 S_u bytes) plus, in bf16/fp16, the compute-type copy the gathers read (2 S_u bytes). A unit
// whose optimizer is offloaded (optim.offload) keeps only its gradient and compute copy on the device
// (optimizer), or only its gradient (optimizer+params: its compute copy passes through one of two staging buffers
// on its way to a gather). Gathered parameters and full gradients are unit-sized buffers in the compute type,
// allocated once: a dedicated one for the tied embedding (unit 0) and pools for the rest; at one rank the parameters'
// are sized by the units that gather copies (units_in_place), and hold nothing where none does.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/process_memory.h"
#include "shardtrain/model/decoder.h"
#include "shardtrain/model/decoder_stage.h"
#include "shardtrain/model/units.h"

namespace st {

// Device memory outside the plan's own allocations: the CUDA context, NCCL's channel buffers and cuBLASLt's
// internal state. Counted so that a cap of 24 GiB means the whole card.
inline constexpr int64_t kRuntimeReserveBytes = int64_t{768} << 20;

// A unit gathered whole for the host (ckpt.export, the end-of-run sample, tests) passes through the device a piece at
// a time: this many bytes of every rank's shard together, and a rank's own piece staged from the host where its master
// lives there (optim.offload). The CUDA plan's workspace counts both.
inline constexpr int64_t kGatherPieceBytes = int64_t{16} << 20;

// What the communication plan adds to the device memory.
struct CommPlan {
  int prefetch_depth = 1;               // gathers in flight ahead of the unit computing (dist.prefetch_depth)
  int64_t replica_bucket_elements = 0;  // hybrid: one bucket of gradient shards as they cross nodes
  bool exchange_reduce = false;         // copy-engine reduce-scatters: their all-to-all lands a whole unit
};

// Gathered-parameter buffers besides unit 0's: the unit computing plus prefetch_depth gathered ahead when
// dist.reshard_after_forward (else every block and the head keep their own until backward).
int param_pool_size(const Config& cfg, const CommPlan& comm);
// Full-gradient buffers besides unit 0's: the unit computing plus as many reduce-scatters in flight.
int grad_pool_size(const CommPlan& comm);

// Element counts that size the gather buffers.
struct UnitSizes {
  int64_t emb_full = 0;        // unit 0's gathered parameters (gathered_elements; 0 where it computes in place)
  int64_t unit_full = 0;       // the largest other unit's gathered parameters, of those that gather a copy
  int64_t emb_grad_full = 0;   // unit 0's full gradient (its trainable slot * world)
  int64_t unit_grad_full = 0;  // the largest other unit's full gradient
  int64_t max_slot = 0;        // the largest shard of trainable state
  int64_t slots = 0;           // the sum of those shards
  int64_t frozen_slots = 0;    // the sum of the frozen tensors' shards in the compute dtype (LoRA's base)
  int64_t nf4_words = 0;       // the sum of the NF4 units' shards of storage, in 4-byte words (model/nf4_base.h)
  int64_t nf4_full = 0;        // words of the largest NF4 unit's gathered storage (0 at world 1: no gather copy)
  // Loading an NF4 base quantises one tensor at a time from its fp32 values: the largest frozen segment of an NF4
  // unit (the host view), its largest matrix, and the largest unit's storage.
  int64_t nf4_segment = 0, nf4_tensor = 0, nf4_storage_words = 0;
};
// `in_place`: per unit, whether it computes on its shard (units_in_place; empty: none does).
UnitSizes unit_sizes(const std::vector<UnitLayout>& units, int world, const std::vector<bool>& in_place = {});

// The elements of a unit's gathered parameter buffer: the trainable slots of every rank, with the frozen tensors'
// slots gathered from element numel on (units.h), so max(slot * world, numel + frozen_slot * world); an NF4 unit's
// frozen segment is dequantised there, numel + frozen_numel.
int64_t gathered_elements(const UnitLayout& unit, int world);

// Which units read their parameters from their shards in place: at one rank (of the sharding group) a gather would
// copy the shard whole, so a unit whose parameters are its shard alone (not offloaded, no frozen base, no
// dist.fp8_gather) computes on its shard, and the parameter buffers are sized by the units that gather copies (none
// where every unit computes in place). At one rank the reduce-scatter is the addition into the shard, with no copy
// between either.
std::vector<bool> units_in_place(const Config& cfg, const std::vector<UnitLayout>& units, int world);

// Which units optim.offload moves to the host: from the last unit back, until optim.offload_fraction of the
// parameters is covered (all of them at 1). The first units, the tied embedding first, keep their optimizer on
// the device, so the next step's forward can start while the host AdamW still works on the later units. A wholly
// frozen unit (LoRA's embedding and head) has no optimizer state and is never offloaded.
std::vector<bool> offloaded_units(const Config& cfg, const std::vector<UnitLayout>& units);

// What the compute side needs besides the sharded state and the gather buffers: the CUDA model's activations and its
// kernel scratch, and the libraries' fixed workspaces (cuBLASLt, the reduction scratch).
struct ComputeFootprint {
  int64_t activation_bytes = 0;
  int64_t workspace_bytes = 0;
  int64_t runtime_reserve_bytes = kRuntimeReserveBytes;  // memory the runtime holds outside the plan's buffers
};

// Bytes per rank, by kind.
struct MemoryPlan {
  int64_t sharded_state = 0;
  int64_t gather_buffers = 0;
  int64_t activations = 0;
  int64_t workspace = 0;    // the footprint's workspace plus its runtime reserve
  int64_t snapshot = 0;     // host plans: the checkpoint snapshot's copy of param, m and v (ckpt.async with ckpt.dir)
  int64_t export_unit = 0;  // host plans: ckpt.export's unit at the end of the run (export_host_bytes, host_plan.h)
  int64_t total() const { return sharded_state + gather_buffers + activations + workspace + snapshot + export_unit; }
  std::string breakdown() const;  // "sharded state 1.23 GiB, gather buffers ..., total ..."
};

// Sharded state bytes per rank for the compute type's element size (4: fp32, 2: bf16/fp16).
int64_t sharded_state_bytes(const Config& cfg, const std::vector<UnitLayout>& units, int world, int64_t element_bytes);

// The plan for cfg (model, dtype, offload, reshard_after_forward) sharded over `world` ranks.
MemoryPlan plan_memory(const Config& cfg, int world, const CommPlan& comm, const ComputeFootprint& compute);

// The memory one rank may plan: the device's free memory, capped by dist.max_gpu_mem_gib where set.
struct DeviceBudget {
  int64_t free = 0, cap = 0;
  bool capped = false;
  int64_t usable() const { return cap < free ? cap : free; }
  static DeviceBudget of(const Config& cfg, int64_t free_bytes);
};

// kBadInput when the plan exceeds the budget: the message gives the plan's breakdown, what limits it (the cap, or
// `device`'s free memory) and what to change: `advice()` where given, asked only on refusal (start-up asks the plan
// search, plan_search.h), else the knobs that lower a device plan.
void check_memory_plan(const MemoryPlan& plan, const DeviceBudget& budget, const std::string& device,
                       const std::function<std::string()>& advice = nullptr);

// generate's GPU decoder of max_batch sequences (decoder_footprint, model/decoder.h) against the same budget, before
// anything is allocated: whole (stages 1), or split over `stages` GPUs, one stage each (model/decoder_stage.h:
// split_units' stages, each of which must fit). kBadInput with the footprint's breakdown (a split's: every stage's,
// naming its units), what limits it and what to lower (generate's --batch, model.seq_len, the compute type; or more
// GPUs for a split).
void check_decoder_memory(const Config& cfg, int max_batch, const DeviceBudget& budget, const std::string& device,
                          int stages = 1);
// Whether check_decoder_memory passes.
bool decoder_fits(const Config& cfg, int max_batch, const DeviceBudget& budget, int stages = 1);
// The footprint of each of split_units' `stages` stages (one, the whole model's, for stages 1).
std::vector<DecoderFootprint> stage_footprints(const Config& cfg, int max_batch, int stages);
// The most sequences, from 1 to `want`, whose decoder (split over `stages` GPUs) fits the budget: 1 when none does
// (check_decoder_memory then says why).
int fitting_batch(const Config& cfg, int want, const DeviceBudget& budget, int stages = 1);

// Where generate's GPU decoder goes on `ranks` ranks (one GPU each, `budget` the smallest of theirs): the sequences it
// holds (`want`, or with fit_batch as many as fit up to it: fitting_batch) and its stages: 1 (every rank decodes the
// whole model) or `ranks` (a layer split). LayerSplit::kAuto splits only when the whole decoder does not fit (at the
// batch asked for, or at one sequence when fitting one); kLayers always, kNone never. The placement is checked
// (check_decoder_memory: kBadInput with its breakdown) before anything is allocated.
struct DecoderPlacement {
  int max_batch = 1;
  int stages = 1;
};
DecoderPlacement place_decoder(const Config& cfg, int want, bool fit_batch, LayerSplit split, int ranks,
                               const DeviceBudget& budget, const std::string& device);

// generate's host memory on one rank, planned before a weight is read: `cfg` is the run's (its model with adapters
// for a LoRA checkpoint; the decoder's is base_model(cfg.model)), its decoder holding max_batch sequences of `stage`.
//   decoder   train.device = cpu: the decoder itself, decoder_footprint in fp32 (its weights, key/value caches and
//             activations; no runtime term)
//   loading   the load's buffers beside the decoder's: on cuda two of the largest held unit's fp32 buffers (the one
//             read reuses the last one's, which grows to a larger unit by a copy); a LoRA checkpoint is read whole
//             first (every held unit with its adapters), then each unit merged as it is handed over (on cuda one merged
//             unit beside it; the CPU decoder keeps the merged units as each full one is freed); and the file
//             reads' buffers (kStreamingIoBytes)
//   upload    cuda: the two pinned chunks a unit goes up in (kDecoderUploadChunk elements of the compute type each)
//             and, split over ranks, the pinned rows passed between them (max(seq_len, batch) x n_embd)
//   reserve   what runs beside them: kHostReserveBytes on the CPU, kCudaHostReserveBytes (the CUDA runtime and
//             cuBLASLt) on cuda
struct DecoderHostPlan {
  int64_t decoder = 0, loading = 0, upload = 0, reserve = 0;
  int64_t total() const { return decoder + loading + upload + reserve; }
  // "decoder 4.80 GiB (weights 4.60 GiB, key/value caches 0.06 GiB, activations 0.14 GiB), loading 0.25 GiB,
  // reserve 0.25 GiB; total 5.30 GiB" (cpu), "loading 2.00 GiB, upload 0.03 GiB, reserve 3.00 GiB; total ..." (cuda)
  std::string breakdown() const;
  DecoderFootprint decoder_parts;  // the CPU decoder's terms (runtime 0)
};
DecoderHostPlan plan_decoder_host(const Config& cfg, int max_batch, const DecoderStage& stage = {});
// kBadInput when the plan exceeds the budget (core/process_memory.h: MemAvailable, the cgroup's limit or an rlimit,
// split between the host's ranks): the breakdown, the limit that binds, and what to change.
void check_decoder_host_memory(const Config& cfg, int max_batch, const DecoderStage& stage,
                               const HostMemoryBudget& budget);

// The end-of-run sample's decoder (StepEngine::generate: one sequence, the units gathered into it one at a time) beside
// the training state, which stays allocated: on cuda its device footprint (decoder_footprint in the compute type) and
// on the host a gathered unit's buffer, its merged copy (LoRA) and the pinned upload chunks; on the CPU no device, and
// on the host the decoder itself (decoder_footprint in fp32, which keeps each gathered buffer) and a LoRA unit's
// gathered buffer beside its merged copy.
struct SampleFootprint {
  int64_t device = 0, host = 0;
};
SampleFootprint sample_footprint(const Config& cfg);
// Why the sample does not fit `device_free` bytes of the device and `host` (the budget left now): "" when it does, else
// "its decoder needs 16.21 GiB of device memory, 9.80 GiB are free" and the like.
std::string sample_misfit(const Config& cfg, int64_t device_free, const HostMemoryBudget& host);

// The CPU backend (ShardedModel, fp32) plans the same terms in host memory: the 16 S_u bytes of sharded state per
// unit whatever optim.offload says (the optimizer already runs on the host), gather buffers at prefetch depth 0
// (every collective blocks), the model's activations and scratch (its family's cpu_footprint_bytes; with train.fp8
// the cast copies of the largest GEMM's operands),
// kHostReserveBytes for what runs beside them, with background checkpoints (ckpt.dir and ckpt.async) the
// snapshot's 12 S_u bytes per unit, and with ckpt.export the unit it gathers at the end (export_host_bytes), beside
// all of that.
//
//   check_host_memory_plan(cfg, world, bucket, host_memory_budget(host_memory_limits(), comm.device_ranks()));
//
// What runs beside the plan's buffers: the data pipeline's batches, OpenBLAS's and OpenMP's threads (their stacks
// and malloc arenas count in full against RLIMIT_AS), MPI's shared-memory segments. For the tiny model these came to
// a small part of the reserve (docs/performance.md, "CPU figures"); the rest leaves room for a larger model's
// per-thread buffers.
inline constexpr int64_t kHostReserveBytes = int64_t{256} << 20;

// The plan of one CPU rank for cfg sharded over `world` ranks; replica_bucket_elements is hybrid sharding's bucket.
MemoryPlan plan_host_memory(const Config& cfg, int world, int64_t replica_bucket_elements);

// kBadInput when the plan exceeds the budget (core/process_memory.h): the plan's breakdown, the limit that binds
// (MemAvailable, the cgroup's memory.max, RLIMIT_AS or RLIMIT_DATA, and how many ranks share it) and what to change.
// A model whose parameter count alone overflows the plan's arithmetic is refused the same way, before it is built.
// `advice`, where given, says what to change where the plan exceeds the budget (start-up asks the plan search,
// plan_search.h); otherwise, and for the overflow, the knobs that lower a plan.
void check_host_memory_plan(const Config& cfg, int world, int64_t replica_bucket_elements,
                            const HostMemoryBudget& budget, const std::function<std::string()>& advice = nullptr);

}  // namespace st
