#include "shardtrain/shard/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <iomanip>

#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/kernels/scratch_sizes.h"
#include "shardtrain/model/family.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/nf4_base.h"
#include "shardtrain/model/recompute.h"
#include "shardtrain/shard/fp8_gather.h"
#include "shardtrain/shard/host_plan.h"
#include "shardtrain/shard/shard_span.h"

namespace st {
int param_pool_size(const Config& cfg, const CommPlan& comm) {
  return cfg.dist.reshard_after_forward ? comm.prefetch_depth + 1 : cfg.model.n_layer + 1;
}

int grad_pool_size(const CommPlan& comm) { return comm.prefetch_depth + 1; }

int64_t gathered_elements(const UnitLayout& unit, int world) {
  const int64_t slot = padded_shard_size(unit.numel, world);
  if (unit.nf4_base) return std::max(slot * world, unit.numel + unit.frozen_numel);
  const int64_t frozen = padded_shard_size(unit.frozen_numel, world);
  return std::max(slot * world, frozen > 0 ? unit.numel + frozen * world : 0);
}

UnitSizes unit_sizes(const std::vector<UnitLayout>& units, int world, const std::vector<bool>& in_place) {
  UnitSizes s;
  for (const UnitLayout& u : units) {
    const int64_t slot = padded_shard_size(u.numel, world);
    const int64_t full = in_place.empty() || !in_place[static_cast<size_t>(u.index)] ? gathered_elements(u, world) : 0;
    if (u.index == 0) {
      s.emb_full = full;
      s.emb_grad_full = slot * world;
    } else {
      s.unit_full = std::max(s.unit_full, full);
      s.unit_grad_full = std::max(s.unit_grad_full, slot * world);
    }
    s.max_slot = std::max(s.max_slot, slot);
    s.slots += slot;
    if (!u.nf4_base) {
      s.frozen_slots += padded_shard_size(u.frozen_numel, world);
      continue;
    }
    const Nf4UnitStorage storage = nf4_unit_storage(u);
    const int64_t nf4_slot = padded_shard_size(storage.words, world);
    s.nf4_words += nf4_slot;
    if (world > 1) s.nf4_full = std::max(s.nf4_full, nf4_slot * world);
    s.nf4_segment = std::max(s.nf4_segment, u.frozen_numel);
    s.nf4_storage_words = std::max(s.nf4_storage_words, storage.words);
    for (const Nf4Part& p : storage.parts)
      if (p.quantized) s.nf4_tensor = std::max(s.nf4_tensor, p.numel);
  }
  return s;
}

std::vector<bool> offloaded_units(const Config& cfg, const std::vector<UnitLayout>& units) {
  std::vector<bool> out(units.size(), false);
  if (cfg.optim.offload == OffloadMode::kNone) return out;
  int64_t total = 0, covered = 0;
  for (const UnitLayout& u : units) total += u.numel;
  const double target = static_cast<double>(cfg.optim.offload_fraction) * static_cast<double>(total);
  for (size_t i = units.size(); i-- > 0 && static_cast<double>(covered) < target;) {
    out[i] = units[i].numel > 0;  // a wholly frozen unit (LoRA's embedding and head) has no optimizer state
    covered += units[i].numel;
  }
  return out;
}

std::vector<bool> units_in_place(const Config& cfg, const std::vector<UnitLayout>& units, int world) {
  std::vector<bool> out = offloaded_units(cfg, units);
  for (size_t u = 0; u < units.size(); ++u)
    out[u] = world == 1 && !cfg.dist.fp8_gather && !out[u] && units[u].frozen_numel == 0 && !units[u].nf4_base;
  return out;
}

int64_t sharded_state_bytes(const Config& cfg, const std::vector<UnitLayout>& units, int world, int64_t t) {
  const std::vector<bool> off = offloaded_units(cfg, units);
  int64_t bytes = 0, staged_slot = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const int64_t slot = padded_shard_size(units[i].numel, world);
    if (!off[i]) {
      bytes += slot * (16 + (t == 4 ? 0 : t));  // fp32 gathers read the master itself
    } else if (cfg.optim.offload == OffloadMode::kOptimizer) {
      bytes += slot * (4 + t);
    } else {
      bytes += slot * 4;
      staged_slot = std::max(staged_slot, slot);
    }
  }
  return bytes + 2 * staged_slot * t;
}

MemoryPlan plan_memory(const Config& cfg, int world, const CommPlan& comm, const ComputeFootprint& compute) {
  const std::vector<UnitLayout> units = build_units(cfg.model);
  const UnitSizes s = unit_sizes(units, world, units_in_place(cfg, units, world));
  const int64_t t = dtype_bytes(cfg.compute_dtype());
  MemoryPlan p;
  p.sharded_state = sharded_state_bytes(cfg, units, world, t) + s.frozen_slots * t  // the frozen base: its dtype
                    + s.nf4_words * 4;                                              // or NF4
  // dist.fp8_gather_keep: the codes each rank keeps of its shard through a step (fp8_gather.h).
  if (cfg.dist.fp8_gather_keep)
    p.sharded_state += fp8_gather_kept_bytes(cfg.model, units, world, fp8_policy(cfg.train.fp8), t);
  // Parameters (of the units that gather copies), full gradients, the reduce-scatter's output (none at one rank: the
  // addition reads the full gradient), the hybrid bucket, an NF4 unit's gathered storage.
  const int64_t params = s.emb_full + param_pool_size(cfg, comm) * s.unit_full;
  const int64_t grads = s.emb_grad_full + grad_pool_size(comm) * s.unit_grad_full;
  int64_t rs_out = world > 1 ? s.max_slot : 0;
  if (comm.exchange_reduce) rs_out = std::max(s.emb_grad_full, s.unit_grad_full);
  p.gather_buffers = (params + grads + rs_out + comm.replica_bucket_elements) * t + s.nf4_full * 4;
  // dist.fp8_gather's staging of the codes (fp8_gather.h).
  if (cfg.dist.fp8_gather)
    p.gather_buffers += fp8_gather_staging_bytes(cfg.model, units, world, fp8_policy(cfg.train.fp8), t);
  p.activations = compute.activation_bytes;
  p.workspace = compute.workspace_bytes + compute.runtime_reserve_bytes;
  // Loading an NF4 base, after every buffer above is allocated: on the CPU the unit's whole frozen segment and its
  // storage; on a GPU one matrix's fp32 values uploaded, the unit's storage and the quantiser's scratch.
  if (s.nf4_segment > 0)
    p.workspace += cfg.train.device == Device::kCpu
                       ? 4 * (s.nf4_segment + s.nf4_storage_words)
                       : 4 * (s.nf4_tensor + s.nf4_storage_words) +
                             static_cast<int64_t>(gpu::nf4_quantize_scratch_bytes(s.nf4_tensor));
  return p;
}

std::string MemoryPlan::breakdown() const {
  return str_cat("sharded state ", format_gib(sharded_state), ", gather buffers ", format_gib(gather_buffers),
                 ", activations ", format_gib(activations), ", workspace ", format_gib(workspace),
                 snapshot > 0 ? ", checkpoint snapshot " + format_gib(snapshot) : std::string(),
                 export_unit > 0 ? ", export " + format_gib(export_unit) : std::string(), "; total ",
                 format_gib(total()));
}

DeviceBudget DeviceBudget::of(const Config& cfg, int64_t free_bytes) {
  DeviceBudget b;
  b.free = free_bytes;
  b.capped = cfg.dist.max_gpu_mem_gib > 0;
  b.cap = b.capped ? static_cast<int64_t>(cfg.dist.max_gpu_mem_gib * double(int64_t{1} << 30)) : free_bytes;
  return b;
}

namespace {

// What binds a budget: the cap where it is below the free memory, else the device's free memory.
std::string budget_limit(const DeviceBudget& budget, const std::string& device) {
  return budget.capped && budget.cap < budget.free ? str_cat("dist.max_gpu_mem_gib caps it at ", format_gib(budget.cap))
                                                   : str_cat(device, " has ", format_gib(budget.free), " free");
}

}  // namespace

void check_memory_plan(const MemoryPlan& plan, const DeviceBudget& budget, const std::string& device,
                       const std::function<std::string()>& advice) {
  if (plan.total() <= budget.usable()) return;
  ST_BAD_INPUT("device memory: this config needs ", format_gib(plan.total()), " per rank (", plan.breakdown(),
               "), but ", budget_limit(budget, device), "; ",
               advice ? advice() : "lower train.micro_batch, set train.recompute=true, or use more ranks");
}

std::vector<DecoderFootprint> stage_footprints(const Config& cfg, int max_batch, int stages) {
  if (stages <= 1) return {decoder_footprint(cfg.model, cfg.compute_dtype(), max_batch)};
  const std::vector<UnitRange> ranges = split_units(cfg.model, max_batch, stages);
  std::vector<DecoderFootprint> out;
  for (int s = 0; s < stages; ++s)
    out.push_back(decoder_footprint(cfg.model, cfg.compute_dtype(), max_batch,
                                    DecoderStage{s, stages, ranges[static_cast<size_t>(s)], nullptr}));
  return out;
}

namespace {

int64_t largest_total(const std::vector<DecoderFootprint>& stages) {
  int64_t most = 0;
  for (const DecoderFootprint& f : stages) most = std::max(most, f.total());
  return most;
}

}  // namespace

bool decoder_fits(const Config& cfg, int max_batch, const DeviceBudget& budget, int stages) {
  return largest_total(stage_footprints(cfg, max_batch, stages)) <= budget.usable();
}

void check_decoder_memory(const Config& cfg, int max_batch, const DeviceBudget& budget, const std::string& device,
                          int stages) {
  const std::vector<DecoderFootprint> f = stage_footprints(cfg, max_batch, stages);
  const int64_t most = largest_total(f);
  if (most <= budget.usable()) return;
  const std::string what =
      str_cat("device memory: a decoder of ", max_batch, " sequence(s) of ", cfg.model.seq_len, " positions");
  // What would make it fit: bf16 only where it computes in fp32.
  const std::string lower = cfg.compute_dtype() == DType::kF32
                                ? "; lower generate's --batch or model.seq_len, compute in bf16 (train.dtype), or "
                                : "; lower generate's --batch or model.seq_len, or ";
  if (stages <= 1)
    ST_BAD_INPUT(what, " needs ", format_gib(most), " (", f[0].breakdown(), "), but ", budget_limit(budget, device),
                 lower, "split its layers over several GPUs (mpirun -np N shardtrain generate)");
  const std::vector<UnitRange> ranges = split_units(cfg.model, max_batch, stages);
  std::string each;
  for (int s = 0; s < stages; ++s)
    each += str_cat(s == 0 ? "" : "; ", "rank ", s, " (", describe_units(cfg.model, ranges[static_cast<size_t>(s)]),
                    "): ", f[static_cast<size_t>(s)].breakdown());
  ST_BAD_INPUT(what, " split over ", stages, " GPUs needs ", format_gib(most), " on its largest stage (", each,
               "), but ", budget_limit(budget, device), lower, "split over more GPUs");
}

int fitting_batch(const Config& cfg, int want, const DeviceBudget& budget, int stages) {
  int batch = std::max(want, 1);
  while (batch > 1 && !decoder_fits(cfg, batch, budget, stages)) --batch;
  return batch;
}

DecoderPlacement place_decoder(const Config& cfg, int want, bool fit_batch, LayerSplit split, int ranks,
                               const DeviceBudget& budget, const std::string& device) {
  auto batch = [&](int stages) { return fit_batch ? fitting_batch(cfg, want, budget, stages) : std::max(want, 1); };
  DecoderPlacement p;
  if (split == LayerSplit::kLayers || (split == LayerSplit::kAuto && ranks > 1 && !decoder_fits(cfg, batch(1), budget)))
    p.stages = ranks;
  p.max_batch = batch(p.stages);
  check_decoder_memory(cfg, p.max_batch, budget, device, p.stages);
  return p;
}

MemoryPlan plan_host_memory(const Config& cfg, int world, int64_t replica_bucket_elements) {
  Config host = cfg;
  host.train.dtype = DType::kF32;
  host.optim.offload = OffloadMode::kNone;  // the CPU backend holds all four fp32 states either way
  CommPlan comm;
  comm.prefetch_depth = 0;
  comm.replica_bucket_elements = replica_bucket_elements;
  ComputeFootprint compute;
  compute.activation_bytes =
      model_family(cfg.model.arch).cpu_footprint_bytes(cfg.model, cfg.train.micro_batch, recompute_of(cfg.train));
  compute.runtime_reserve_bytes = kHostReserveBytes;
  if (cfg.train.fp8 != Fp8Recipe::kOff) {  // the two cast operands of the largest GEMM (model/cpu_linear.h)
    const int64_t N = cfg.train.micro_batch * cfg.model.seq_len;
    int64_t a = 0, b = 0;
    for (const UnitLayout& u : build_units(cfg.model))
      for (const TensorSpec& t : u.tensors)
        if (u.kind == UnitKind::kBlock && t.shape.size() == 2) {
          a = std::max(a, N * std::max(t.shape[0], t.shape[1]));
          b = std::max(b, std::max(t.numel, N * t.shape[1]));
        }
    compute.activation_bytes += 4 * (a + b);
  }
  MemoryPlan plan = plan_memory(host, world, comm, compute);
  // param, m and v of the 16 bytes an element of sharded state holds (checkpoint_saver.h)
  if (cfg.ckpt.async && !cfg.ckpt.dir.empty())
    plan.snapshot = sharded_state_bytes(host, build_units(cfg.model), world, 4) / 16 * 12;
  plan.export_unit = export_host_bytes(cfg, world);
  return plan;
}

void check_host_memory_plan(const Config& cfg, int world, int64_t replica_bucket_elements,
                            const HostMemoryBudget& budget, const std::function<std::string()>& advice) {
  const std::string what_to_change = "; lower train.micro_batch, set train.recompute=true, or use more ranks";
  // The plan counts elements in int64_t, which wraps for an n_embd or seq_len in the millions of millions: its
  // largest terms are estimated in floating point first, and a config past 2^60 bytes (an exbibyte) is refused
  // on that estimate alone.
  const ModelConfig& m = cfg.model;
  const double C = static_cast<double>(m.n_embd), L = static_cast<double>(m.n_layer),
               T = static_cast<double>(m.seq_len);
  const double B = static_cast<double>(cfg.train.micro_batch), BT = B * T;
  const double params = (static_cast<double>(m.padded_vocab()) + T) * C + L * (12.0 * C * C + 13.0 * C) + 2.0 * C;
  const double state = 16.0 * params / static_cast<double>(std::max(world, 1));
  const double activations =
      4.0 * (L * (15.0 * BT * C + B * static_cast<double>(m.n_head) * T * T) + (L + 16.0) * BT * C);
  if (state + activations > std::ldexp(1.0, 60))
    ST_BAD_INPUT("host memory: this config needs about ", std::setprecision(3),
                 (state + activations) / std::ldexp(1.0, 30), " GiB per rank (", params, " parameters), but ",
                 budget.limited_by, what_to_change);
  const MemoryPlan plan = plan_host_memory(cfg, world, replica_bucket_elements);
  if (plan.total() <= budget.bytes) return;
  ST_BAD_INPUT("host memory: this config needs ", format_gib(plan.total()), " per rank (", plan.breakdown(), "), but ",
               budget.limited_by, advice ? "; " + advice() : what_to_change);
}

std::string DecoderHostPlan::breakdown() const {
  std::string out;
  if (decoder > 0)
    out =
        str_cat("decoder ", format_gib(decoder), " (weights ", format_gib(decoder_parts.weights), ", key/value caches ",
                format_gib(decoder_parts.cache), ", activations ", format_gib(decoder_parts.activations), "), ");
  out += str_cat("loading ", format_gib(loading));
  if (upload > 0) out += str_cat(", upload ", format_gib(upload));
  return out + str_cat(", reserve ", format_gib(reserve), "; total ", format_gib(total()));
}

DecoderHostPlan plan_decoder_host(const Config& cfg, int max_batch, const DecoderStage& stage) {
  const ModelConfig base = base_model(cfg.model);
  const std::vector<bool> held = held_units(base, stage);
  const bool cuda = cfg.train.device == Device::kCuda;
  DecoderHostPlan p;
  if (!cuda) {
    p.decoder_parts = decoder_footprint(base, DType::kF32, max_batch, stage);
    p.decoder_parts.runtime = 0;
    p.decoder = p.decoder_parts.total();
  }
  int64_t largest = 0, held_base = 0;
  for (const UnitLayout& u : build_units(base))
    if (held[static_cast<size_t>(u.index)]) {
      largest = std::max(largest, 4 * u.numel);
      held_base += 4 * u.numel;
    }
  if (cfg.model.lora.enabled()) {
    int64_t whole = 0;  // the held units of the LoRA model, trainable and frozen, as the checkpoint's read holds them
    for (const UnitLayout& u : build_units(cfg.model))
      if (held[static_cast<size_t>(u.index)]) whole += 4 * (u.numel + u.frozen_numel);
    // On the CPU the merged units are the decoder's weights, counted there, each taking a freed full unit's place.
    p.loading = (cuda ? whole : whole - held_base) + largest;
  } else {
    p.loading = cuda ? 2 * largest : 0;
  }
  p.loading += kStreamingIoBytes;
  p.upload = cuda ? 2 * kDecoderUploadChunk * dtype_bytes(cfg.compute_dtype()) : 0;
  // A split's rows pass between the ranks through a pinned buffer of the decoder's most rows (CudaDecoder).
  if (cuda && stage.split())
    p.upload += std::max<int64_t>(base.seq_len, max_batch) * base.n_embd * dtype_bytes(cfg.compute_dtype());
  p.reserve = cuda ? kCudaHostReserveBytes : kHostReserveBytes;
  return p;
}

void check_decoder_host_memory(const Config& cfg, int max_batch, const DecoderStage& stage,
                               const HostMemoryBudget& budget) {
  const DecoderHostPlan p = plan_decoder_host(cfg, max_batch, stage);
  if (p.total() <= budget.bytes) return;
  const bool cuda = cfg.train.device == Device::kCuda;
  const std::string whose =
      stage.split() ? str_cat(" on rank ", stage.index, " of a split over ", stage.count) : std::string();
  const std::string what =
      cuda ? std::string("generate on cuda")
           : str_cat("generate on cpu with ", max_batch, " sequence(s) of ", cfg.model.seq_len, " positions");
  ST_BAD_INPUT("host memory: ", what, " needs ", format_gib(p.total()), whose, " (", p.breakdown(), "), but ",
               budget.limited_by,
               cuda ? "; free host memory, or run fewer ranks on this host"
                    : "; lower generate's --batch or model.seq_len, decode on a GPU (--train.device=cuda), or split "
                      "the layers over more hosts (--split layers under mpirun)");
}

SampleFootprint sample_footprint(const Config& cfg) {
  const ModelConfig base = base_model(cfg.model);
  SampleFootprint f;
  if (cfg.train.device == Device::kCuda) {
    f.device = decoder_footprint(base, cfg.compute_dtype(), 1).total();
    // The unit in hand, merged, and the two pinned chunks it is uploaded through (padding of one rank).
    f.host = gathered_unit_host_bytes(cfg, 1) + 2 * kDecoderUploadChunk * dtype_bytes(cfg.compute_dtype());
  } else {
    // The merged units are the decoder's weights; with LoRA the gathered unit in hand beside them.
    DecoderFootprint d = decoder_footprint(base, DType::kF32, 1);
    d.runtime = 0;
    int64_t gathered = 0;
    for (const UnitLayout& u : build_units(cfg.model)) gathered = std::max(gathered, 4 * (u.numel + u.frozen_numel));
    f.host = d.total() + (cfg.model.lora.enabled() ? gathered : 0);
  }
  return f;
}

std::string sample_misfit(const Config& cfg, int64_t device_free, const HostMemoryBudget& host) {
  const SampleFootprint f = sample_footprint(cfg);
  if (f.device > device_free)
    return str_cat("its decoder needs ", format_gib(f.device), " of device memory beside the training state, ",
                   format_gib(device_free), " are free");
  if (f.host > host.bytes)
    return str_cat("its decoder needs ", format_gib(f.host), " of host memory beside the training state, but ",
                   host.limited_by);
  return "";
}

}  // namespace st
