#include "shardtrain/shard/comm_tuning.h"

#include <algorithm>
#include <utility>

#include "shardtrain/comm/gpu_topology.h"
#include "shardtrain/core/env.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"

namespace st {
namespace {

// Prefetch depth, measured per link (docs/topology.md, "Communication tuning per link"): over NVLink one unit ahead
// hides the gathers and deeper gains nothing; without peer-to-peer 1 and 2 are alike, and 2 guards against uneven op
// lengths for one more unit of memory; over sockets more gathers in flight queue ahead of the reduce-scatters on the
// one link, so 1 is best.
int default_prefetch_depth(LinkKind k) {
  switch (k) {
    case LinkKind::kNvlink:
      return 1;
    case LinkKind::kPcie:
      return 2;
    case LinkKind::kNetwork:
      return 1;
  }
  return 1;
}

// The most CTAs of a block's gradient reduce-scatter (docs/topology.md). Over NVLink 4 beats NCCL's own choice: the
// backward's kernels lose fewer SMs to the reduce-scatter it overlaps. The embedding's reduce-scatter, the step's
// last, which the next forward waits for, keeps NCCL's choice: capped it is exposed. Capping the gathers too
// (NCCL_MAX_CTAS) exposes them. pcie, network: not measured; NCCL's choice.
int default_reduce_scatter_ctas(LinkKind k) { return k == LinkKind::kNvlink ? 4 : 0; }

// The all-gathers on the copy engines (NCCL's zero-CTA path) against NCCL's kernels (docs/topology.md): over NVLink
// the copy engines take no SM from the compute, and the step is faster. pcie, network: NCCL has no copy-engine path
// there.
bool default_copy_engine_gathers(LinkKind k) { return k == LinkKind::kNvlink; }

// The reduce-scatters as NCCL's zero-CTA (copy-engine) all-to-all, the owner adding the slices (docs/topology.md):
// faster than a 4-CTA reduce-scatter and its accumulation at a block's sizes, with less peak memory, and the backward
// keeps every SM. pcie, network: NCCL has no copy-engine path there.
bool default_copy_engine_reduce_scatters(LinkKind k) { return k == LinkKind::kNvlink; }

// The all-reduce across nodes (hybrid sharding), by dist.bucket_mb over sockets (docs/topology.md): one unit a call
// has the best median (at GPT-2 124M a block's shard is 14 MB, so small buckets make nearly the same plan); one
// bucket for the whole model waits for the end of the backward and loses the overlap. A bucket helps small units
// (small models, slow LANs) amortise the per-call latency; set dist.bucket_mb for those.
constexpr int64_t kDefaultBucketBytes = 0;

}  // namespace

const char* to_string(LinkKind k) {
  switch (k) {
    case LinkKind::kNvlink:
      return "nvlink";
    case LinkKind::kPcie:
      return "pcie";
    case LinkKind::kNetwork:
      return "network";
  }
  return "?";
}

LinkKind classify_link(bool crosses_nodes, bool p2p_disabled, bool all_pairs_nvlink) {
  if (crosses_nodes) return LinkKind::kNetwork;
  if (p2p_disabled || !all_pairs_nvlink) return LinkKind::kPcie;
  return LinkKind::kNvlink;
}

LinkKind shard_link(const ShardingGroups& groups) {
  const GpuTopology topo = discover_gpu_topology();
  bool nvlink = !topo.link.empty();
  for (size_t a = 0; a < topo.link.size(); ++a)
    for (size_t b = 0; b < topo.link[a].size(); ++b)
      if (a != b && topo.link[a][b].rfind("NV", 0) != 0) nvlink = false;
  const std::string p2p = env_get("NCCL_P2P_DISABLE");
  return classify_link(groups.shard_peers_off_node > 0, !p2p.empty() && p2p != "0", nvlink);
}

CommTuning default_comm_tuning(LinkKind shard_link) {
  CommTuning t;
  t.prefetch_depth = default_prefetch_depth(shard_link);
  t.bucket_bytes = kDefaultBucketBytes;
  t.reduce_scatter_ctas = default_reduce_scatter_ctas(shard_link);
  t.copy_engine_gathers = default_copy_engine_gathers(shard_link);
  t.copy_engine_reduce_scatters = default_copy_engine_reduce_scatters(shard_link);
  return t;
}

// dist.<key> (gather_engine or reduce_engine) resolved: copy is refused off NVLink peer-to-peer or without NCCL's
// copy-engine collectives; auto takes `by_default` where NCCL has them. Appends ", <what> on ..." to `why`.
bool resolve_engine(CommEngine engine, const char* key, const char* what, bool by_default, LinkKind shard_link,
                    bool copy_engines, std::string* why) {
  if (engine == CommEngine::kCopy) {
    if (shard_link != LinkKind::kNvlink)
      ST_BAD_INPUT("dist.", key, " = copy needs the sharding group on one node's GPUs over NVLink with peer-to-peer, ",
                   "but its link is ", to_string(shard_link), "; set dist.", key, " = sm or auto");
    if (!copy_engines)
      ST_BAD_INPUT("dist.", key, " = copy needs NCCL 2.28 or newer (its copy-engine collectives), which this build ",
                   "does not link; set dist.", key, " = sm or auto");
  }
  const bool copy = engine == CommEngine::kAuto ? by_default && copy_engines : engine == CommEngine::kCopy;
  *why += str_cat(", ", what, " on ", copy ? "the copy engines" : "NCCL's kernels",
                  engine != CommEngine::kAuto   ? str_cat(" (dist.", key, ")")
                  : by_default && !copy_engines ? str_cat(" (default for ", to_string(shard_link), " needs NCCL 2.28)")
                                                : str_cat(" (default for ", to_string(shard_link), ")"));
  return copy;
}

CommTuning resolve_comm_tuning(const DistConfig& dist, LinkKind shard_link, bool hybrid, bool copy_engines) {
  CommTuning t = default_comm_tuning(shard_link);
  const bool depth_set = dist.prefetch_depth >= 0, bucket_set = dist.bucket_mb >= 0;
  const bool ctas_set = dist.reduce_scatter_ctas >= 0;
  if (depth_set) t.prefetch_depth = static_cast<int>(dist.prefetch_depth);
  if (ctas_set) t.reduce_scatter_ctas = static_cast<int>(dist.reduce_scatter_ctas);
  if (bucket_set) t.bucket_bytes = static_cast<int64_t>(dist.bucket_mb * double(int64_t{1} << 20));
  t.why = str_cat("communication: prefetch depth ", t.prefetch_depth,
                  depth_set ? " (dist.prefetch_depth)" : str_cat(" (default for ", to_string(shard_link), ")"));
  if (hybrid)
    t.why += str_cat(", all-reduce across nodes in buckets of ",
                     t.bucket_bytes == 0 ? "one unit" : format_mib(t.bucket_bytes),
                     bucket_set ? " (dist.bucket_mb)" : " (default for network)");
  t.copy_engine_gathers = resolve_engine(dist.gather_engine, "gather_engine", "gathers", t.copy_engine_gathers,
                                         shard_link, copy_engines, &t.why);
  if (dist.reduce_engine == CommEngine::kAuto && ctas_set) {  // a CTA cap asks for NCCL's kernels
    t.copy_engine_reduce_scatters = false;
    t.why += ", reduce-scatters on NCCL's kernels (dist.reduce_scatter_ctas)";
  } else {
    t.copy_engine_reduce_scatters = resolve_engine(dist.reduce_engine, "reduce_engine", "reduce-scatters",
                                                   t.copy_engine_reduce_scatters, shard_link, copy_engines, &t.why);
  }
  if (t.copy_engine_reduce_scatters) {
    if (ctas_set)
      ST_BAD_INPUT(
          "dist.reduce_scatter_ctas (", dist.reduce_scatter_ctas,
          ") caps NCCL's reduce-scatter kernels, which dist.reduce_engine = copy does not run; leave it at -1");
    t.reduce_scatter_ctas = 0;
  } else {
    t.why += str_cat(", block reduce-scatters on ",
                     t.reduce_scatter_ctas == 0 ? std::string("NCCL's choice of CTAs")
                                                : str_cat("at most ", t.reduce_scatter_ctas, " CTAs"),
                     ctas_set ? " (dist.reduce_scatter_ctas)" : str_cat(" (default for ", to_string(shard_link), ")"));
  }
  t.why += str_cat("; sharding group link: ", to_string(shard_link));
  return t;
}

ReplicaBuckets::ReplicaBuckets(std::vector<int64_t> unit_elements, int64_t bucket_elements)
    : elements_(std::move(unit_elements)), bucket_(bucket_elements), joined_(elements_.size(), false) {
  ST_CHECK(bucket_elements >= 0, "bucket of ", bucket_elements, " elements");
  capacity_ = bucket_;
  for (int64_t e : elements_) {
    ST_CHECK(e >= 0, "unit of ", e, " elements");
    capacity_ = std::max(capacity_, e);
  }
}

std::vector<ReplicaBuckets::Bucket> ReplicaBuckets::add(int unit) {
  ST_CHECK(unit >= 0 && static_cast<size_t>(unit) < elements_.size(), "unit ", unit, " outside 0..",
           elements_.size());
  ST_CHECK(!joined_[static_cast<size_t>(unit)], "unit ", unit, " joined a bucket twice in one step");
  joined_[static_cast<size_t>(unit)] = true;
  ++joined_count_;
  std::vector<Bucket> out;
  const int64_t n = elements_[static_cast<size_t>(unit)];
  if (!pending_.units.empty() && pending_.elements + n > capacity_) out.push_back(std::exchange(pending_, Bucket{}));
  pending_.units.push_back(unit);
  pending_.offsets.push_back(pending_.elements);
  pending_.elements += n;
  const bool last = joined_count_ == static_cast<int64_t>(elements_.size());
  if (pending_.elements >= bucket_ || last) out.push_back(std::exchange(pending_, Bucket{}));
  if (last) drop();  // the step's every unit has gone out: the next step starts empty
  return out;
}

void ReplicaBuckets::drop() {
  pending_ = Bucket{};
  std::fill(joined_.begin(), joined_.end(), false);
  joined_count_ = 0;
}

}  // namespace st
