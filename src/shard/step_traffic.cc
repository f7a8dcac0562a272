#include "shardtrain/shard/step_traffic.h"

#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/model/fp8_policy.h"
#include "shardtrain/model/nf4_base.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/fp8_gather.h"
#include "shardtrain/shard/schedule.h"
#include "shardtrain/shard/shard_span.h"

namespace st {
int64_t unit_gather_bytes(const Config& cfg, const UnitLayout& u, int world, bool kept) {
  const Fp8Policy fp8 = fp8_policy(cfg.train.fp8);
  const int64_t t = dtype_bytes(cfg.compute_dtype());
  int64_t bytes = 0;
  for (bool frozen : {false, true}) {
    if (frozen && u.nf4_base) {
      if (world > 1) bytes += padded_shard_size(nf4_unit_storage(u).words, world) * world * 4;
      continue;
    }
    const Fp8GatherSegment g =
        cfg.dist.fp8_gather ? fp8_gather_segment(cfg.model, u, frozen, world, fp8) : Fp8GatherSegment{};
    if (g.empty())
      bytes += padded_shard_size(frozen ? u.frozen_numel : u.numel, world) * world * t;
    else
      bytes += kept ? g.kept_received_bytes(t) : g.received_bytes(t);
  }
  return bytes;
}

int64_t gathered_model_bytes(const Config& cfg, int world) {
  int64_t bytes = 0;
  for (const UnitLayout& u : build_units(cfg.model)) bytes += unit_gather_bytes(cfg, u, world);
  return bytes;
}

StepTraffic step_traffic(const Config& cfg, int world, int shard_world, bool hybrid) {
  ST_CHECK(world >= 1 && shard_world >= 1 && world % shard_world == 0, "step_traffic: ", world, " ranks sharded over ",
           shard_world);
  const std::vector<UnitLayout> units = build_units(cfg.model);
  const int64_t t = dtype_bytes(cfg.compute_dtype());
  StepTraffic s;
  s.shard_world = shard_world;
  s.micro_steps = cfg.grad_accum_steps(world);
  const bool cuda = cfg.train.device == Device::kCuda;
  // dist.fp8_gather_keep: a unit's first gather of the step casts, its later ones send what that one kept.
  const bool keep = cfg.dist.fp8_gather_keep;
  std::vector<char> gathered_once(units.size(), 0);
  int64_t first = 0;  // the gathers' bytes that only the step's first micro-step receives
  for (const ScheduleOp& op : training_schedule(cfg.model.n_layer, cfg.dist.reshard_after_forward, cuda)) {
    const UnitLayout& u = units[static_cast<size_t>(op.unit)];
    if (op.kind == OpKind::kGather) {
      const int64_t kept = unit_gather_bytes(cfg, u, shard_world, keep);
      s.gathered += kept;
      if (keep && !gathered_once[static_cast<size_t>(op.unit)]) first += unit_gather_bytes(cfg, u, shard_world) - kept;
      gathered_once[static_cast<size_t>(op.unit)] = 1;
    }
    if (op.kind == OpKind::kReduceScatter && u.numel > 0)
      s.reduce_scattered += padded_shard_size(u.numel, shard_world) * shard_world * t;
  }
  s.gathered = s.gathered * s.micro_steps + first;
  s.reduce_scattered *= s.micro_steps;
  const int nodes = world / shard_world;
  if (hybrid && nodes > 1) {
    int64_t shards = 0;
    for (const UnitLayout& u : units) shards += padded_shard_size(u.numel, shard_world);
    s.across_nodes = shards * t * 2 * (nodes - 1) / nodes;
  }
  return s;
}

}  // namespace st
