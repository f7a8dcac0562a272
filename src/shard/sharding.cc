#include "shardtrain/shard/sharding.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/step_traffic.h"

namespace st {
namespace {

std::string gbs(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f GB/s", v);
  return b;
}

std::string ms(double seconds) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f ms", seconds * 1e3);
  return b;
}

// Seconds to move `bytes` at `gbs` GB/s; a group that measured nothing (0 GB/s) never wins.
double seconds_at(double bytes, double gbs) {
  if (bytes <= 0) return 0;
  return gbs > 0 ? bytes / (gbs * 1e9) : 1e30;
}

}  // namespace

ShardingChoice choose_sharding(const ShardingEstimate& e) {
  const double P = static_cast<double>(e.params);
  const double per_micro = static_cast<double>(e.gathers_per_micro_step) * static_cast<double>(e.gathered_bytes) +
                           P * static_cast<double>(e.grad_bytes);
  const double micro = static_cast<double>(e.micro_steps);
  ShardingChoice c;
  c.full_s = seconds_at(micro * per_micro * (e.world - 1) / e.world, e.world_all_gather);
  c.hybrid_s =
      seconds_at(micro * per_micro * (e.local - 1) / e.local, e.node_all_gather) +
      seconds_at(2.0 * (e.nodes - 1) / e.nodes * P / e.local * static_cast<double>(e.grad_bytes), e.replica_all_reduce);
  std::string memory;
  if (e.full_fits && e.hybrid_fits) {
    c.hybrid = c.hybrid_s < c.full_s;
    memory = "both fit in memory";
  } else if (e.full_fits != e.hybrid_fits) {
    c.hybrid = e.hybrid_fits;
    memory = e.hybrid_fits ? "only hybrid fits in memory"
                           : str_cat("only full fits in memory (hybrid holds ", e.nodes, "x the state per rank)");
  } else {
    c.hybrid = false;
    memory = "neither fits in memory: full needs the least";
  }
  c.why = str_cat(c.hybrid ? "hybrid" : "full", ": estimated communication per step ", ms(c.full_s), " full, ",
                  ms(c.hybrid_s), " hybrid (all-gather over all ", e.world, " ranks ", gbs(e.world_all_gather),
                  e.local > 1 ? str_cat(", within a node ", gbs(e.node_all_gather)) : std::string(),
                  "; all-reduce across the ", e.nodes, " nodes ", gbs(e.replica_all_reduce), "); ", memory,
                  " (dist.sharding=auto)");
  return c;
}

double host_busbw(Communicator& comm, CollectiveOp op) {
  constexpr int64_t kCount = int64_t{1} << 22;  // 16 MiB of floats per rank
  const int n = comm.world_size();
  std::vector<float> shard(static_cast<size_t>(kCount), 1.0f), full(static_cast<size_t>(kCount) * n, 1.0f);
  const double best = fastest_collective_seconds(comm, [&] {
    switch (op) {
      case CollectiveOp::kAllGather:
        comm.all_gather(shard.data(), kCount, full.data());
        break;
      case CollectiveOp::kReduceScatter:
        comm.reduce_scatter(full.data(), kCount, shard.data());
        break;
      case CollectiveOp::kAllReduce:
        comm.all_reduce(shard.data(), kCount);
        break;
    }
  });
  return bus_bandwidth(op, n, static_cast<double>(kCount * sizeof(float)), best);
}

double fastest_collective_seconds(Communicator& comm, const std::function<void()>& op) {
  op();
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    op();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

SplitSpec node_split(const Communicator& world) { return {world.node_id(), world.rank()}; }
SplitSpec replica_split(const Communicator& world) { return {world.local_rank(), world.node_id()}; }

ShardingGroups make_sharding_groups(const Config& cfg, Communicator& world, const AutoShardingInputs& in) {
  ShardingGroups g;
  g.world = &world;
  g.shard_peers_off_node = world.world_size() - world.local_size();  // full; hybrid sets 0 below
  const ShardingMode asked = cfg.dist.sharding;
  if (asked == ShardingMode::kFull) {
    g.why = "full: every unit sharded over all " + std::to_string(world.world_size()) + " rank(s) (dist.sharding=full)";
    return g;
  }
  // How many nodes, and whether they are alike: max node id, min and max ranks per node, agreed by all.
  double facts[3] = {static_cast<double>(world.node_id()), -static_cast<double>(world.local_size()),
                     static_cast<double>(world.local_size())};
  std::vector<double> all(static_cast<size_t>(3 * world.world_size()), 0.0);
  for (int k = 0; k < 3; ++k) all[static_cast<size_t>(3 * world.rank() + k)] = facts[k];
  world.all_reduce(all.data(), static_cast<int64_t>(all.size()));
  int nodes = 0, min_local = 1 << 30, max_local = 0;
  for (int r = 0; r < world.world_size(); ++r) {
    nodes = std::max(nodes, static_cast<int>(all[static_cast<size_t>(3 * r)]) + 1);
    min_local = std::min(min_local, static_cast<int>(-all[static_cast<size_t>(3 * r + 1)]));
    max_local = std::max(max_local, static_cast<int>(all[static_cast<size_t>(3 * r + 2)]));
  }
  const char* how = asked == ShardingMode::kHybrid ? "dist.sharding=hybrid" : "dist.sharding=auto";
  if (nodes == 1) {
    g.why = str_cat("full: one node, where hybrid is full sharding (", how, ")");
    return g;
  }
  if (min_local != max_local) {
    if (asked == ShardingMode::kHybrid)
      ST_BAD_INPUT("dist.sharding=hybrid needs the same number of ranks on every node; the ", nodes,
                   " nodes have between ", min_local, " and ", max_local);
    g.why = str_cat("full: the ", nodes, " nodes have between ", min_local, " and ", max_local,
                    " ranks, hybrid needs equal nodes (dist.sharding=auto)");
    return g;
  }
  const SplitSpec ns = node_split(world), rs = replica_split(world);
  std::unique_ptr<Communicator> node = world.split(ns.color, ns.key);
  std::unique_ptr<Communicator> replica = world.split(rs.color, rs.key);
  if (asked == ShardingMode::kAuto) {
    // One kind of group at a time on every rank (the groups of a kind at once, as training runs them: the replica
    // groups share the node's network link); the means over all ranks decide, the same on every rank.
    const auto busbw = in.busbw ? in.busbw : host_busbw;
    double bw[3] = {busbw(world, CollectiveOp::kAllGather),
                    min_local > 1 ? busbw(*node, CollectiveOp::kAllGather) : 0.0,
                    busbw(*replica, CollectiveOp::kAllReduce)};
    world.all_reduce(bw, 3);
    ShardingEstimate e;
    e.world = world.world_size();
    e.local = min_local;
    e.nodes = nodes;
    for (const UnitLayout& u : build_units(cfg.model)) e.params += u.numel;
    e.gathered_bytes = gathered_model_bytes(cfg, e.world);
    e.grad_bytes = in.grad_bytes;
    e.gathers_per_micro_step = cfg.dist.reshard_after_forward ? 2 : 1;
    e.micro_steps = cfg.grad_accum_steps(e.world);
    e.world_all_gather = bw[0] / e.world;
    e.node_all_gather = bw[1] / e.world;
    e.replica_all_reduce = bw[2] / e.world;
    e.full_fits = !in.fits || in.fits(e.world);
    e.hybrid_fits = !in.fits || in.fits(e.local);
    const ShardingChoice choice = choose_sharding(e);
    g.why = choice.why;
    if (!choice.hybrid) return g;
  } else {
    g.why = str_cat("hybrid: each unit sharded over the ", min_local, " rank(s) of a node, replicated on ", nodes,
                    " nodes (dist.sharding=hybrid)");
  }
  g.mode = ShardingMode::kHybrid;
  g.shard_peers_off_node = 0;
  g.node = std::move(node);
  g.replica = std::move(replica);
  return g;
}

}  // namespace st
