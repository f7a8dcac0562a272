// The communicators of dist.sharding. Full ZeRO-3 shards every unit over the whole world. Hybrid (HSDP) shards it
// over the ranks of one node and keeps one replica per node: gathers and reduce-scatters stay inside the node, and
// only the reduce-scattered gradient shard crosses nodes, all-reduced among the ranks that hold the same shard
// (one per node, same local rank). Auto picks one from all-reduce bandwidths measured at start, and says why.
//
//   ShardingGroups g = make_sharding_groups(cfg, world);   // collective
//   g.shard().all_gather(...);                             // the node's ranks (hybrid) or all ranks (full)
//   if (g.replica) g.replica->all_reduce(grad_shard, n);   // across nodes, hybrid only
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"

namespace st {

struct ShardingGroups {
  ShardingMode mode = ShardingMode::kFull;  // resolved: kFull or kHybrid
  std::string why;                          // one line for the log
  std::unique_ptr<Communicator> node;       // hybrid: the ranks of this node
  std::unique_ptr<Communicator> replica;    // hybrid: the ranks of every node with this local rank
  Communicator* world = nullptr;
  int shard_peers_off_node = 0;  // members of shard() on other nodes (full over several nodes; 0 in hybrid)

  // The ranks a unit is sharded over.
  Communicator& shard() const { return node ? *node : *world; }
  // Copies of the sharded state (nodes, in hybrid) and which one this rank holds.
  int replicas() const { return replica ? replica->world_size() : 1; }
  int replica_index() const { return replica ? replica->rank() : 0; }
  // Bytes that cross nodes for collectives over `elements` per rank, of `bytes_per_element`: an all-gather or
  // reduce-scatter over shard(), or an all-reduce over replica (counters' cross_node_bytes).
  int64_t shard_cross_bytes(int64_t elements, int64_t bytes_per_element) const {
    return elements * bytes_per_element * shard_peers_off_node;
  }
  int64_t replica_cross_bytes(int64_t elements, int64_t bytes_per_element) const {
    const int r = replicas();
    return r <= 1 ? 0 : elements * bytes_per_element * 2 * (r - 1) / r;
  }
};

// Seconds of the fastest of 3 calls of the collective `op` over `comm`, each after a barrier, after one untimed
// warm-up call. Collective. (auto's bandwidth measurement and `shardtrain topo`.)
double fastest_collective_seconds(Communicator& comm, const std::function<void()>& op);

// Collective over `world`. kBadInput for dist.sharding=hybrid when the nodes have different numbers of ranks.
// With one node hybrid is full sharding (and says so).
ShardingGroups make_sharding_groups(const Config& cfg, Communicator& world);

}  // namespace st
