#include "shardtrain/ckpt/node_local.h"

#include <algorithm>

#include "shardtrain/core/error.h"

namespace st {

std::string node_ckpt_dir(const std::string& pattern, int node) {
  static const std::string kNode = "{node}";
  std::string out = pattern;
  const std::string id = std::to_string(node);
  for (size_t at = out.find(kNode); at != std::string::npos; at = out.find(kNode, at + id.size()))
    out.replace(at, kNode.size(), id);
  return out;
}

int NodeLayout::holder_of(int rank) const {
  const int node = node_of[static_cast<size_t>(rank)];
  return ranks[static_cast<size_t>((node + nodes - 1) % nodes)]
              [static_cast<size_t>(local_of[static_cast<size_t>(rank)])];
}

int NodeLayout::source_of(int rank) const {
  const int node = node_of[static_cast<size_t>(rank)];
  return ranks[static_cast<size_t>((node + 1) % nodes)][static_cast<size_t>(local_of[static_cast<size_t>(rank)])];
}

std::string NodeLayout::describe_node(int node) const {
  const std::vector<int>& r = ranks[static_cast<size_t>(node)];
  if (r.size() == 1) return str_cat("node ", node, " (rank ", r[0], ")");
  const bool contiguous = r.back() - r.front() + 1 == static_cast<int>(r.size());
  if (contiguous) return str_cat("node ", node, " (ranks ", r.front(), "-", r.back(), ")");
  std::string list;
  for (int x : r) list += (list.empty() ? "" : ", ") + std::to_string(x);
  return str_cat("node ", node, " (ranks ", list, ")");
}

NodeLayout node_layout(Communicator& comm) {
  const int world = comm.world_size();
  std::vector<double> all(static_cast<size_t>(2 * world), 0.0);  // node and local rank of every rank, summed
  all[static_cast<size_t>(2 * comm.rank())] = comm.node_id();
  all[static_cast<size_t>(2 * comm.rank() + 1)] = comm.local_rank();
  comm.all_reduce(all.data(), static_cast<int64_t>(all.size()));
  NodeLayout l;
  l.nodes = 0;
  for (int r = 0; r < world; ++r) {
    l.node_of.push_back(static_cast<int>(all[static_cast<size_t>(2 * r)]));
    l.local_of.push_back(static_cast<int>(all[static_cast<size_t>(2 * r + 1)]));
    l.nodes = std::max(l.nodes, l.node_of.back() + 1);
  }
  l.ranks.resize(static_cast<size_t>(l.nodes));
  for (int r = 0; r < world; ++r) {
    std::vector<int>& on = l.ranks[static_cast<size_t>(l.node_of[static_cast<size_t>(r)])];
    const auto local = static_cast<size_t>(l.local_of[static_cast<size_t>(r)]);
    if (on.size() <= local) on.resize(local + 1, -1);
    on[local] = r;
  }
  return l;
}

void check_replica_layout(const NodeLayout& layout) {
  if (layout.nodes < 2)
    ST_BAD_INPUT(
        "ckpt.replicas=1 keeps each node's checkpoint files on the next node's disk, but this run has one "
        "node (",
        layout.ranks[0].size(),
        " rank(s)): a replica on the same disk protects nothing. Use "
        "ckpt.replicas=0 (the default) on one machine");
  std::string counts;
  bool equal = true;
  for (int n = 0; n < layout.nodes; ++n) {
    const size_t size = layout.ranks[static_cast<size_t>(n)].size();
    equal = equal && size == layout.ranks[0].size();
    counts += str_cat(n == 0 ? "" : ", ", "node ", n, " has ", size);
  }
  if (!equal)
    ST_BAD_INPUT(
        "ckpt.replicas=1 pairs each rank with the rank of the same local rank on the next node, so every "
        "node needs the same number of ranks: ",
        counts,
        ". Start the same number of ranks on each node, or "
        "use ckpt.replicas=0 with a shared ckpt.dir");
}

void check_replica_sharding(ModelBackend& model, Communicator& comm) {
  if (model.shard_comm().world_size() == comm.world_size()) return;
  ST_BAD_INPUT(
      "ckpt.replicas=1 needs every rank to write its own file (dist.sharding=full), but this run shards "
      "within each node (dist.sharding=hybrid, ",
      model.shard_comm().world_size(),
      " ranks per shard group), where only node 0's ranks write. Set dist.sharding=full, or use "
      "ckpt.replicas=0 with a shared ckpt.dir");
}

}  // namespace st
