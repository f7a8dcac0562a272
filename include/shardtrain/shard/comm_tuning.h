// How far communication runs ahead of compute, and how the cross-node gradient all-reduce is batched, chosen per
// link kind. Links differ in bandwidth by two orders of magnitude (NVLink, PCIe without peer-to-peer through host
// memory, sockets; docs/topology.md has the figures), so one setting does not suit all:
//
//   prefetch depth  units whose all-gather may be in flight ahead of the unit computing (and gradient buffers whose
//                   reduce-scatter may still run behind it): depth + 1 gathered units of memory each way (cuda).
//   bucket bytes    hybrid sharding's all-reduce across nodes: finished gradient shards of consecutive units are
//                   summed in one call once a bucket holds this many bytes (0: one call per unit).
//   reduce-scatter  the most CTAs NCCL may run a block's gradient reduce-scatter on (0: NCCL's own choice). Those
//   CTAs            CTAs take SMs from the backward the reduce-scatter overlaps; one with fewer runs longer but
//                   still hides behind it (cuda).
//   gather engine   the parameter all-gathers on the copy engines (NCCL's zero-CTA path, between symmetric windows)
//                   or on NCCL's kernels (cuda). The copy engines take no SM; NCCL offers them within one node over
//                   NVLink peer-to-peer, from 2.28.
//   reduce engine   the gradient reduce-scatters as NCCL's kernels, or as a copy-engine all-to-all of the slices
//                   (same conditions) whose owner adds them as it takes its shard (cuda).
//
// dist.prefetch_depth, dist.bucket_mb, dist.reduce_scatter_ctas, dist.gather_engine and dist.reduce_engine set them; -1
// or auto (their defaults) take the measured default for the link kind, default_comm_tuning(), whose measurements are
// in docs/topology.md ("Communication tuning per link").
//
//   const LinkKind link = classify_link(groups.shard_peers_off_node > 0, p2p_disabled, all_pairs_nvlink);
//   const CommTuning t = resolve_comm_tuning(cfg.dist, link, /*hybrid=*/groups.replica != nullptr);
//   ST_LOG_INFO(t.why);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/shard/sharding.h"

namespace st {

enum class LinkKind {
  kNvlink,   // every pair of the group's GPUs has NVLink, and peer-to-peer is on
  kPcie,     // one node without NVLink or without peer-to-peer (NCCL_P2P_DISABLE): copies through host memory
  kNetwork,  // the group spans nodes: sockets or InfiniBand between them
};
const char* to_string(LinkKind k);

// A group's link: crossing nodes decides first, then peer-to-peer, then NVLink between every pair.
LinkKind classify_link(bool crosses_nodes, bool p2p_disabled, bool all_pairs_nvlink);

// The link of groups.shard() on this machine: across nodes from the groups; NVLink between every pair of the visible
// GPUs from NVML (gpu_topology.h; none visible, or NVML missing: not NVLink); peer-to-peer off when NCCL_P2P_DISABLE
// is set to anything but 0 (the start-up peer check sets it when copies fail).
LinkKind shard_link(const ShardingGroups& groups);

struct CommTuning {
  int prefetch_depth = 1;
  int64_t bucket_bytes = 0;
  int reduce_scatter_ctas = 0;       // 0: NCCL's own choice
  bool copy_engine_gathers = false;  // dist.gather_engine resolved
  bool copy_engine_reduce_scatters = false;  // dist.reduce_engine resolved (reduce_scatter_ctas is then 0)
  std::string why;                   // one line for the log: each value and where it came from
};

// The measured defaults: prefetch depth for the link of the sharding group, bucket size for the link between nodes.
CommTuning default_comm_tuning(LinkKind shard_link);

// dist.prefetch_depth, dist.bucket_mb and dist.reduce_scatter_ctas where set (>= 0), the defaults for `shard_link`
// otherwise; dist.gather_engine and dist.reduce_engine likewise, where `copy_engines` says whether the linked NCCL
// has the copy-engine path (nccl_has_copy_engine_collectives()). Throws kBadInput for either engine = copy on another
// link than NVLink, or without that NCCL, and for reduce_engine = copy with reduce_scatter_ctas set. `hybrid`: whether
// the run all-reduces across nodes (only then does the bucket size say anything, and the log says so).
CommTuning resolve_comm_tuning(const DistConfig& dist, LinkKind shard_link, bool hybrid, bool copy_engines = false);

// Groups finished gradient shards into all-reduce buckets. Units join in the order their gradients become final (the
// backward's); a bucket goes out as soon as it holds at least `bucket_elements`, or when every unit has joined. A
// bucket never holds more than capacity() elements: a unit that would overflow it sends the bucket out first. Every
// rank sees the same units in the same order, so the collectives match.
//
//   ReplicaBuckets b(slots, bucket_elements);
//   for (int u : backward_order)
//     for (const ReplicaBuckets::Bucket& out : b.add(u)) all_reduce(out);   // units at offsets, `elements` in all
class ReplicaBuckets {
 public:
  struct Bucket {
    std::vector<int> units;
    std::vector<int64_t> offsets;  // of each unit in the bucket's buffer
    int64_t elements = 0;
  };

  // unit_elements[u]: the elements of unit u's shard (all units, in unit order). bucket_elements >= 0.
  ReplicaBuckets(std::vector<int64_t> unit_elements, int64_t bucket_elements);

  // The largest bucket: max(bucket_elements, the largest unit), the staging buffer a backend needs.
  int64_t capacity() const { return capacity_; }
  // Unit u's gradient is final for this step: the buckets to all-reduce now, in order (none, one or two). Throws on a
  // unit that already joined this step. The last unit of a step sends out what is pending and starts the next step.
  std::vector<Bucket> add(int unit);
  // Units that joined this step but have not gone out.
  int64_t pending_units() const { return static_cast<int64_t>(pending_.units.size()); }
  // Units that joined this step: 0 before the first and again once the last has gone out.
  int64_t joined_units() const { return joined_count_; }
  // Forgets this step's units (a step abandoned before its backward ended).
  void drop();

 private:
  std::vector<int64_t> elements_;
  int64_t bucket_ = 0, capacity_ = 0;
  std::vector<bool> joined_;
  int64_t joined_count_ = 0;
  Bucket pending_;
};

}  // namespace st
