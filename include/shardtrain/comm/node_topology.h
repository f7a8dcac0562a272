// Node topology from per-rank node keys: which ranks share a machine.
//
// Every rank contributes one key (equal keys = same node): the lowest world rank of its shared-memory
// node, or the SHARDTRAIN_NODE_ID override. From the keys of all ranks, in rank order, each rank derives
// the same numbering without further communication:
//   node_id    dense, 0.., in order of each node's lowest rank;
//   local_rank this rank's index among the ranks of its node, in rank order;
//   local_size how many ranks its node has.
//
//   node_topology_from_keys({7, 3, 7, 3}, 2)  ->  {node_id 0, local_rank 1, local_size 2, num_nodes 2}
#pragma once

#include <cstdint>
#include <vector>

namespace st {

struct NodeTopology {
  int node_id = 0;
  int local_rank = 0;
  int local_size = 1;
  int num_nodes = 1;
};

// keys.size() is the world size; 0 <= rank < keys.size().
NodeTopology node_topology_from_keys(const std::vector<int64_t>& keys, int rank);

// The SHARDTRAIN_NODE_ID override of this process, read through core/env.h: false when unset (empty);
// true with *id set when it is an integer. Anything else is kBadInput naming the variable and its value.
bool node_id_override(int64_t* id);

}  // namespace st
