// Node-local checkpoint directories with peer replicas (ckpt.replicas = 1), for machines without a shared
// filesystem (docs/checkpoint-format.md, "Node-local directories").
//
// Every node saves into its own ckpt.dir: the same path on each machine's disk, or a path with {node} in it, which
// becomes the node id (node_ckpt_dir). The nodes form a ring: each rank also sends its file to the rank of the same
// local rank on the previous node, its replica holder, so node k's directory holds its own ranks' files (primaries)
// and node k + 1's (replicas; the last node holds node 0's). Each node's leader (local rank 0) commits its own
// directory. A node whose directory is lost gets its files back from its neighbours at resume (replica_resume.h).
//
//   const NodeLayout layout = node_layout(comm);        // collective
//   check_replica_layout(layout);                       // 2+ nodes, equal rank counts: kBadInput otherwise
//   const std::string dir = node_ckpt_dir(cfg.ckpt.dir, comm.node_id());
//   int holder = layout.holder_of(comm.rank());         // where this rank's file goes
#pragma once

#include <string>
#include <vector>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/shard/model_backend.h"

namespace st {

// `pattern` with every "{node}" replaced by the node id ("ckpt/node{node}" -> "ckpt/node1").
std::string node_ckpt_dir(const std::string& pattern, int node);

// The world's ranks by node.
struct NodeLayout {
  int nodes = 1;
  std::vector<int> node_of;             // by rank
  std::vector<int> local_of;            // by rank: the local rank
  std::vector<std::vector<int>> ranks;  // by node: its ranks, by local rank

  // The rank of the same local rank on the previous node (node - 1; node 0's: the last node), which keeps this
  // rank's file as a replica, and on the next node (node + 1; the last node's: node 0), whose file this rank keeps.
  int holder_of(int rank) const;
  int source_of(int rank) const;
  // "node 0 (ranks 0-1)", for messages.
  std::string describe_node(int node) const;
};

// Every rank's node and local rank, from comm's topology. Collective.
NodeLayout node_layout(Communicator& comm);

// kBadInput (the same on every rank, whose layouts are equal) unless the ring of replicas exists: 2 or more nodes,
// each with the same number of ranks (the pairing is by local rank). Names the node count or each node's ranks.
void check_replica_layout(const NodeLayout& layout);

// kBadInput unless every rank writes a file of its own (dist.sharding=full): with hybrid sharding only node 0's
// ranks write, and the others' directories would stay empty.
void check_replica_sharding(ModelBackend& model, Communicator& comm);

}  // namespace st
