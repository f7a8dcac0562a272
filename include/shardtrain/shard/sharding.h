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

// What dist.sharding=auto weighs, per optimizer step, for one rank. choose_sharding() is the pure decision (tested
// with numbers); make_sharding_groups measures the bandwidths and fills it.
struct ShardingEstimate {
  int world = 1, local = 1, nodes = 1;  // ranks, ranks per node, nodes (equal nodes)
  int64_t params = 0;                   // trainable elements: what gradients move
  int64_t gathered_bytes = 0;           // bytes one gather of every unit moves (step_traffic.h's gathered_model_bytes)
  int64_t grad_bytes = 4;               // bytes per element of a gradient reduce-scatter / all-reduce
  int64_t gathers_per_micro_step = 2;   // forward, and again in backward (dist.reshard_after_forward)
  int64_t micro_steps = 1;              // gradient accumulation: gathers and reduce-scatters per step
  // Bus bandwidth in GB/s (nccl-tests' definition): all-gather over the world and over a node, all-reduce over
  // a replica group (one rank per node, all replica groups at once, as training runs them).
  double world_all_gather = 0, node_all_gather = 0, replica_all_reduce = 0;
  bool full_fits = true, hybrid_fits = true;  // one rank's memory holds the state sharded over world / local
};

struct ShardingChoice {
  bool hybrid = false;
  double full_s = 0, hybrid_s = 0;  // estimated communication seconds per step
  std::string why;                  // one line: the estimates, the bandwidths, memory
};

// Estimated per-step communication of each mode, from the bytes each rank moves and the measured bus bandwidths:
//   full:   micro_steps x (gathers x gathered_bytes + P x grad_bytes) x (W-1)/W / world_all_gather
//   hybrid: the same over a node's L ranks at node_all_gather, plus the replica all-reduce of the gradient shard,
//           2 (N-1)/N x P/L x grad_bytes / replica_all_reduce, once per step.
// The faster mode that fits in memory wins; when only one fits, that one; when neither, full (the least memory;
// the backend's memory check then explains).
ShardingChoice choose_sharding(const ShardingEstimate& e);

// What the backend knows for dist.sharding=auto: the model's size and dtypes, how to measure a group's bandwidth
// (default: host collectives through the Communicator), and whether a sharding fits one rank's memory (default:
// always).
struct AutoShardingInputs {
  int64_t params = 0;
  int64_t grad_bytes = 4;                                             // bytes per element of the reduced gradients
  std::function<double(Communicator& group, CollectiveOp op)> busbw;  // GB/s; collective over `group`
  std::function<bool(int group_size)> fits;
};

// Bus bandwidth in GB/s of `op` over `comm` through the Communicator itself (host buffers, 16 MiB of floats per
// rank, fastest of 3). Collective.
double host_busbw(Communicator& comm, CollectiveOp op);

// Seconds of the fastest of 3 calls of the collective `op` over `comm`, each after a barrier, after one untimed
// warm-up call. Collective. (auto's bandwidth measurement and `shardtrain topo`.)
double fastest_collective_seconds(Communicator& comm, const std::function<void()>& op);

// The colour and key of hybrid's splits of `world` (Communicator::split here, ncclCommSplit on GPUs, which must agree):
// node groups ranked by world rank; replica groups (the ranks of every node with one local rank) ranked by node.
struct SplitSpec {
  int color = 0, key = 0;
};
SplitSpec node_split(const Communicator& world);
SplitSpec replica_split(const Communicator& world);

// Collective over `world`. kBadInput for dist.sharding=hybrid when the nodes have different numbers of ranks.
// With one node hybrid is full sharding (and says so). `in` is used by dist.sharding=auto only.
ShardingGroups make_sharding_groups(const Config& cfg, Communicator& world, const AutoShardingInputs& in = {});

}  // namespace st
