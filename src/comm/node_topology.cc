#include "shardtrain/comm/node_topology.h"

#include <charconv>
#include <string>

#include "shardtrain/core/env.h"
#include "shardtrain/core/error.h"

namespace st {

NodeTopology node_topology_from_keys(const std::vector<int64_t>& keys, int rank) {
  const int world = static_cast<int>(keys.size());
  ST_CHECK(rank >= 0 && rank < world, "rank ", rank, " outside [0, ", world, ")");
  NodeTopology t;
  t.local_rank = 0;
  t.local_size = 0;
  t.node_id = -1;
  t.num_nodes = 0;
  // Quadratic in the world size, once at start-up: a rank starts a new node when no lower rank has its key.
  for (int r = 0; r < world; ++r) {
    bool first_of_node = true;
    for (int s = 0; s < r && first_of_node; ++s) first_of_node = keys[s] != keys[r];
    if (first_of_node) {
      if (keys[r] == keys[rank]) t.node_id = t.num_nodes;
      ++t.num_nodes;
    }
    if (keys[r] == keys[rank]) {
      if (r < rank) ++t.local_rank;
      ++t.local_size;
    }
  }
  return t;
}

bool node_id_override(int64_t* id) {
  const std::string value = env_get("SHARDTRAIN_NODE_ID");
  if (value.empty()) return false;
  int64_t parsed = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, parsed);
  if (ec != std::errc() || ptr != end) {
    ST_BAD_INPUT("environment variable SHARDTRAIN_NODE_ID='", value,
                 "' is not an integer (expected a node id such as 0)");
  }
  *id = parsed;
  return true;
}

}  // namespace st
