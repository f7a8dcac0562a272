#include "shardtrain/shard/host_plan.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/memory_plan.h"
#include "shardtrain/shard/shard_span.h"
#include "shardtrain/shard/staging_ring.h"

namespace st {

std::string HostPlan::breakdown() const {
  std::string s = str_cat("optimizer state ", format_gib(optimizer_state), ", staging ", format_gib(staging));
  if (host_parameters > 0) s += ", host parameters " + format_gib(host_parameters);
  if (speculative > 0) {
    s += ", speculative copy " + format_gib(speculative);
    if (speculated_units < offloaded_units)
      s += str_cat(" (", speculated_units, " of ", offloaded_units, " offloaded units)");
  }
  if (snapshot > 0) s += ", checkpoint snapshot " + format_gib(snapshot);
  s += ", loading " + format_gib(loading);
  if (export_unit > 0) s += str_cat(", export ", format_gib(export_unit), " (the larger of loading and export counts)");
  return str_cat(s, ", reserve ", format_gib(reserve), "; total ", format_gib(total()));
}

int64_t gathered_unit_host_bytes(const Config& cfg, int world) {
  const std::vector<UnitLayout> units = build_units(cfg.model), base = build_units(base_model(cfg.model));
  const bool lora = cfg.model.lora.enabled();
  int64_t most = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t trained = padded_shard_size(units[u].numel, world) * world;
    const int64_t frozen = units[u].frozen_numel > 0 ? padded_shard_size(units[u].frozen_numel, world) * world : 0;
    const int64_t gathered = frozen > 0 ? 8 * (trained + frozen) : 4 * trained;
    const int64_t merged = lora ? 4 * (trained + frozen) + 4 * base[u].numel : 0;
    most = std::max({most, gathered, merged});
  }
  return most;
}

int64_t export_host_bytes(const Config& cfg, int world) {
  return cfg.ckpt.export_path.empty() ? 0 : gathered_unit_host_bytes(cfg, world) + kStreamingIoBytes;
}

std::vector<bool> speculated_units(const std::vector<bool>& offloaded, int count) {
  std::vector<bool> out(offloaded.size(), false);
  for (size_t i = offloaded.size(); i-- > 0 && count > 0;)
    if (offloaded[i]) out[i] = true, --count;
  return out;
}

HostPlan plan_cuda_host(const Config& cfg, int world, int speculated) {
  const std::vector<UnitLayout> units = build_units(cfg.model);
  const std::vector<bool> off = offloaded_units(cfg, units), spec = speculated_units(off, speculated);
  const int64_t t = dtype_bytes(cfg.compute_dtype());
  HostPlan p;
  int64_t off_slots = 0, spec_slots = 0, dev_slots = 0, max_slot = 0, max_ring_slot = 0, max_dev_slot = 0,
          max_frozen_slot = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const int64_t slot = padded_shard_size(units[i].numel, world);
    max_slot = std::max(max_slot, slot);
    // An NF4 unit's host view is its whole frozen segment (model_backend.h).
    max_frozen_slot = std::max(
        max_frozen_slot, units[i].nf4_base ? units[i].frozen_numel : padded_shard_size(units[i].frozen_numel, world));
    if (spec[i]) {
      ++p.offloaded_units, ++p.speculated_units;
      off_slots += slot;
      spec_slots += slot;
    } else if (off[i]) {
      ++p.offloaded_units;
      off_slots += slot;
      max_ring_slot = std::max(max_ring_slot, slot);
    } else {
      dev_slots += slot;
      max_dev_slot = std::max(max_dev_slot, slot);
    }
  }
  p.optimizer_state = 12 * off_slots;
  p.staging = (4 + t) * spec_slots;
  p.speculative = 12 * spec_slots;
  if (max_ring_slot > 0) {
    p.staging += staging_ring_bytes(max_ring_slot, t, cfg.optim.offload);
    if (cfg.optim.offload == OffloadMode::kOptimizerParams) p.host_parameters = t * (off_slots - spec_slots);
  }
  if (cfg.ckpt.async && !cfg.ckpt.dir.empty()) p.snapshot = 12 * dev_slots;
  // Random initialisation fills one shard at a time; init.from, checkpoint loads and synchronous saves stream the
  // device-resident units through the host one at a time (param, m and v of the unit in hand, and the file I/O's
  // buffers); offloaded units are read and written in place.
  const bool streams = !(cfg.init.from.empty() && cfg.ckpt.dir.empty());
  p.loading = std::max(4 * max_slot, streams && max_dev_slot > 0 ? 12 * max_dev_slot + kStreamingIoBytes : 0);
  // A LoRA base goes through the host a unit's frozen shard at a time: its fp32 view, and the device copy read back
  // (compute dtype) or the file's reads beside it.
  if (max_frozen_slot > 0)
    p.loading = std::max(p.loading, (4 + t) * max_frozen_slot + (streams ? kStreamingIoBytes : 0));
  p.export_unit = export_host_bytes(cfg, world);
  return p;
}

int resolve_speculation(const Config& cfg, int world, const HostMemoryBudget& budget) {
  if (cfg.optim.offload == OffloadMode::kNone || cfg.optim.offload_speculative == Speculation::kOff) return 0;
  const int offloaded = plan_cuda_host(cfg, world, 0).offloaded_units;
  if (cfg.optim.offload_speculative == Speculation::kOn) return offloaded;
  // Each speculated unit adds its second copy and buffers, and may shrink the ring by one unit's worth: the most
  // that fit, counted down from all.
  for (int k = offloaded; k > 0; --k)
    if (plan_cuda_host(cfg, world, k).total() <= budget.bytes) return k;
  return 0;
}

namespace {

// The changes, one at a time, that bring the plan within `budget` bytes a rank: "ckpt.async=false (...)".
std::vector<std::string> changes_that_fit(const Config& cfg, int world, int speculated, int64_t budget,
                                          int local_ranks) {
  std::vector<std::string> out;
  auto fits = [&](const Config& c, int w, int spec) { return plan_cuda_host(c, w, spec).total() <= budget; };
  if (speculated > 0) {
    // optim.offload_speculative=true: auto speculates what fits, false nothing.
    Config c = cfg;
    c.optim.offload_speculative = Speculation::kAuto;
    const int k = resolve_speculation(c, world, HostMemoryBudget{budget, ""});
    if (k > 0)
      out.push_back(
          str_cat("optim.offload_speculative=auto (", k, " of the ", speculated, " offloaded units speculate)"));
    else if (fits(cfg, world, 0))
      out.push_back("optim.offload_speculative=false");
  }
  if (cfg.ckpt.async && !cfg.ckpt.dir.empty()) {
    Config c = cfg;
    c.ckpt.async = false;
    if (fits(c, world, 0)) out.push_back("ckpt.async=false (no pinned snapshot of the device-resident state)");
  }
  if (cfg.optim.offload != OffloadMode::kNone) {
    // The largest offload fraction, in steps of 0.05, whose host plan fits (the device then holds the rest).
    for (int k = static_cast<int>(cfg.optim.offload_fraction * 20) - 1; k >= 1; --k) {
      Config c = cfg;
      c.optim.offload_fraction = static_cast<float>(k / 20.0);
      if (fits(c, world, 0)) {
        char f[16];
        std::snprintf(f, sizeof(f), "%.2f", k / 20.0);
        out.push_back(str_cat("optim.offload_fraction=", f, " (the device then holds the rest of the state)"));
        break;
      }
    }
  }
  for (int k = 2; k <= 64; k *= 2) {
    if (fits(cfg, world * k, 0)) {
      out.push_back(str_cat(world * k, " ranks on ", world * k / std::max(local_ranks, 1),
                            " host(s) of this size (each rank then holds 1/", world * k, " of the state)"));
      break;
    }
  }
  return out;
}

}  // namespace

HostPlan check_cuda_host_plan(const Config& cfg, int world, const HostMemoryBudget& budget, int local_ranks) {
  const int speculated = resolve_speculation(cfg, world, budget);
  const HostPlan plan = plan_cuda_host(cfg, world, speculated);
  if (plan.total() <= budget.bytes) return plan;
  const std::vector<std::string> changes = changes_that_fit(cfg, world, speculated, budget.bytes, local_ranks);
  std::string advice;
  for (size_t i = 0; i < changes.size(); ++i) advice += (i == 0 ? "" : "; or ") + changes[i];
  ST_BAD_INPUT("host memory: this config needs ", format_gib(plan.total()), " per rank (", plan.breakdown(), ")",
               local_ranks > 1
                   ? str_cat(", ", format_gib(plan.total() * local_ranks), " for this host's ", local_ranks, " ranks")
                   : std::string(),
               ", but ", budget.limited_by, "; ",
               advice.empty() ? std::string("no single change of offload, checkpointing or world size fits it")
                              : "it fits with " + advice,
               "");
}

}  // namespace st
