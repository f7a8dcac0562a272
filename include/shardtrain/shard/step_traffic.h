// What one rank's collectives move in one optimizer step, from the schedule its backend runs (schedule.h: the CPU
// gathers the tied embedding twice a micro-step, cuda keeps it) and the units' layouts: the bytes its parameter
// all-gathers receive and its gradient reduce-scatters take in (each rank's share included, as CommCounters counts
// them), and under hybrid sharding the volume of its all-reduce across nodes. `shardtrain plan` prints it; a LoRA base
// is gathered every micro-step though it has no gradient, an NF4 base travels as its storage, and dist.fp8_gather's
// weights as codes (fp8_gather.h).
//
//   const StepTraffic s = step_traffic(cfg, /*world=*/4, /*shard_world=*/2, /*hybrid=*/true);
//   s.from_peers();   // what crosses links: the shares of the other ranks of the sharding group, and the all-reduce
#pragma once

#include <cstdint>

#include "shardtrain/core/config.h"
#include "shardtrain/model/units.h"

namespace st {

struct StepTraffic {
  int shard_world = 1;
  int64_t micro_steps = 1;
  int64_t gathered = 0;          // bytes the gathers receive (CommCounters::gathered_bytes over the step)
  int64_t reduce_scattered = 0;  // bytes of full gradients reduce-scattered (CommCounters::reduce_scattered_elements)
  int64_t across_nodes = 0;      // hybrid: 2 (r - 1) / r of the rank's gradient shards, r nodes, once a step
  // What moves between ranks: the other ranks' shares of the gathers and reduce-scatters, and the all-reduce.
  int64_t from_peers() const { return (gathered + reduce_scattered) / shard_world * (shard_world - 1) + across_nodes; }
};

// The bytes one gather of `unit` receives at `world` ranks, as the backends count them (CommCounters::gathered_bytes):
// each segment in the compute type, or as its FP8 plan's codes (dist.fp8_gather), and an NF4 base's storage where
// there are other ranks to gather it from. `kept`: a gather that sends what dist.fp8_gather_keep kept (no maxima).
int64_t unit_gather_bytes(const Config& cfg, const UnitLayout& unit, int world, bool kept = false);

// One gather of every unit at `world` ranks (what dist.sharding=auto weighs): with LoRA the frozen base is most of it.
int64_t gathered_model_bytes(const Config& cfg, int world);

// One optimizer step of cfg on `world` ranks, each unit sharded over shard_world of them (hybrid: one replica a node,
// world / shard_world nodes).
StepTraffic step_traffic(const Config& cfg, int world, int shard_world, bool hybrid);

}  // namespace st
