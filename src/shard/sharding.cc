#include "shardtrain/shard/sharding.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "shardtrain/core/error.h"

namespace st {
namespace {

// all-reduce bus bandwidth of `comm` in GB/s, on 16 MiB of floats.
double all_reduce_busbw(Communicator& comm) {
  constexpr int64_t kCount = int64_t{1} << 22;
  std::vector<float> buf(static_cast<size_t>(kCount), 1.0f);
  const double best = fastest_collective_seconds(comm, [&] { comm.all_reduce(buf.data(), kCount); });
  const int n = comm.world_size();
  return n <= 1 ? 0.0 : 2.0 * (n - 1) / n * static_cast<double>(kCount * sizeof(float)) / best / 1e9;
}

std::string gbs(double v) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f GB/s", v);
  return b;
}

}  // namespace

double fastest_collective_seconds(Communicator& comm, const std::function<void()>& op) {
  op();
  double best = 1e30;
  for (int i = 0; i < 3; ++i) {
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    op();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

ShardingGroups make_sharding_groups(const Config& cfg, Communicator& world) {
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
  // Same color = same group; ranked by world rank (node group) or by node (replica group).
  std::unique_ptr<Communicator> node = world.split(world.node_id(), world.rank());
  std::unique_ptr<Communicator> replica = world.split(world.local_rank(), world.node_id());
  if (asked == ShardingMode::kAuto) {
    // Every rank measures its node group, then its replica group (one at a time: they may share links); the
    // means over all ranks decide, the same numbers on every rank.
    double bw[2] = {all_reduce_busbw(*node), all_reduce_busbw(*replica)};
    world.all_reduce(bw, 2);
    const double intra = bw[0] / world.world_size(), inter = bw[1] / world.world_size();
    const bool hybrid = inter < 0.5 * intra;
    g.why = str_cat(hybrid ? "hybrid" : "full", ": all-reduce within a node ", gbs(intra), ", across nodes ",
                    gbs(inter),
                    hybrid ? str_cat(" (under half): gathers stay in the node, for ", nodes,
                                     "x the per-rank state")
                           : std::string(" (at least half): sharding over all ranks needs the least memory"),
                    " (dist.sharding=auto)");
    if (!hybrid) return g;
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
