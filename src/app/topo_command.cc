// `shardtrain topo [--config FILE] [--section.key=value ...]`: what the ranks see of their machines and links,
// and the sharding plan `train` would choose for that config on this world. Collective: run it the way train
// runs (mpirun -np N shardtrain topo ...); rank 0 prints.
//
//   topology: 4 rank(s) on 2 node(s)
//     rank  node  local  host
//        0     0    0/2  box-a
//   gpus on box-a (links from NVML: ok):            (each node's GPUs, PCIe, NVLink/PCIe relation, peer access)
//   ...
//     network: NCCL_SOCKET_IFNAME=enp5s0 (set)
//   links (mpi, 16 MiB of floats per rank, fastest of 3): all-gather and reduce-scatter bus bandwidth
//     group                      ranks  all-gather  reduce-scatter
//     world                          4   12.1 GB/s       11.8 GB/s
//   plan: hybrid: each unit sharded over the 2 rank(s) of a node, replicated on 2 nodes (dist.sharding=hybrid)
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "config_args.h"
#include "shardtrain/comm/gpu_topology.h"
#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/comm/nccl_busbw.h"
#include "shardtrain/comm/nccl_communicator.h"
#include "shardtrain/shard/cuda_memory_plan.h"
#endif
#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/shard/comm_tuning.h"
#include "shardtrain/shard/run_plan.h"
#include "shardtrain/shard/sharding.h"

namespace {

struct Busbw {
  double all_gather = 0, reduce_scatter = 0;  // GB/s
};

struct LinkRow {
  std::string group;
  int ranks = 0;
  Busbw busbw;
};

// nccl-tests' bus bandwidth of the fastest of 3 calls: through NCCL on GPU buffers for a cuda config (what training
// will see), through the communicator on host buffers otherwise (sharding.h).
Busbw measure(st::Communicator& c, bool nccl) {
#ifdef SHARDTRAIN_HAVE_CUDA
  if (nccl) return Busbw{st::nccl_busbw(c, st::CollectiveOp::kAllGather), st::nccl_busbw(c, st::CollectiveOp::kReduceScatter)};
#endif
  (void)nccl;
  return Busbw{st::host_busbw(c, st::CollectiveOp::kAllGather), st::host_busbw(c, st::CollectiveOp::kReduceScatter)};
}

// One rank's plan (run_plan.h: device memory on cuda, host memory on cpu) sharded over `group` of the `world` ranks,
// as "state 1.23 GiB, total 4.56 GiB".
std::string rank_plan(const st::Config& cfg, int group, int world) {
  const st::MemoryPlan p = st::planned_rank_memory(cfg, group, group < world);
  return st::str_cat("state ", st::format_gib(p.sharded_state), ", total ", st::format_gib(p.total()));
}

}  // namespace

int cmd_topo(const std::vector<std::string>& args, st::Communicator& world) {
  const ConfigArgs parsed = parse_config_args(args);
  if (parsed.help) {
    std::puts("usage: shardtrain topo [--config FILE] [--section.key=value ...]   (under mpirun, as train runs)");
    return st::kExitOk;
  }
  const st::Config cfg = st::load_config(parsed.config, parsed.overrides);
  const int rank = world.rank(), n = world.world_size();
  const bool lead = rank == 0;

  // Every rank's node, local rank and host name, through one fixed-size broadcast per rank.
  struct Where {
    int node, local, local_size;
    char host[64];
  };
  std::vector<Where> where(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    Where w{world.node_id(), world.local_rank(), world.local_size(), {0}};
    if (r == rank) gethostname(w.host, sizeof(w.host) - 1);
    world.broadcast(&w, sizeof(w), r);
    where[static_cast<size_t>(r)] = w;
  }
  int nodes = 0;
  for (const Where& w : where) nodes = std::max(nodes, w.node + 1);
  if (lead) {
    std::printf("topology: %d rank(s) on %d node(s)\n  rank  node  local  host\n", n, nodes);
    for (int r = 0; r < n; ++r) {
      const Where& w = where[static_cast<size_t>(r)];
      std::printf("  %4d  %4d  %2d/%-2d  %s\n", r, w.node, w.local, w.local_size, w.host);
    }
  }

  // Each node's GPUs and links as its first rank sees them (NVML), and the network NCCL would use between nodes.
  for (int r = 0; r < n; ++r) {
    if (where[static_cast<size_t>(r)].local != 0) continue;
    std::string text;
    if (r == rank)
      text = st::format_gpu_topology(st::discover_gpu_topology(), where[static_cast<size_t>(r)].host) +
             "  network: " + st::nccl_network_summary() + "\n";
    int64_t size = static_cast<int64_t>(text.size());
    world.broadcast(&size, sizeof(size), r);
    text.resize(static_cast<size_t>(size));
    world.broadcast(text.data(), size, r);
    if (lead) std::fputs(text.c_str(), stdout);
  }

  // The links, group by group: the world, then (with several nodes of equal size) every node group at once and
  // every replica group at once; each group's rank 0 reports through a world all-reduce.
  st::Config hybrid = cfg;
  hybrid.dist.sharding = st::ShardingMode::kHybrid;
  const bool even = std::all_of(where.begin(), where.end(), [&](const Where& w) { return w.local_size == where[0].local_size; });
  std::vector<LinkRow> rows;
  const bool nccl = cfg.train.device == st::Device::kCuda;
  rows.push_back({"world", n, measure(world, nccl)});
  if (nodes > 1 && even) {
    st::ShardingGroups g = st::make_sharding_groups(hybrid, world);
    for (st::Communicator* grp : {g.node.get(), g.replica.get()}) {
      const Busbw b = measure(*grp, nccl);
      const bool is_node = grp == g.node.get();
      const int groups = is_node ? nodes : where[0].local_size, index = is_node ? world.node_id() : world.local_rank();
      std::vector<double> v(static_cast<size_t>(2 * groups), 0.0);
      if (grp->rank() == 0) {
        v[static_cast<size_t>(2 * index)] = b.all_gather;
        v[static_cast<size_t>(2 * index + 1)] = b.reduce_scatter;
      }
      world.all_reduce(v.data(), static_cast<int64_t>(v.size()));
      for (int k = 0; k < groups; ++k)
        rows.push_back({is_node ? st::str_cat("node ", k) : st::str_cat("across nodes, local rank ", k),
                        grp->world_size(), Busbw{v[static_cast<size_t>(2 * k)], v[static_cast<size_t>(2 * k + 1)]}});
    }
  }
  if (lead) {
    std::printf("links (%s, fastest of 3): all-gather and reduce-scatter bus bandwidth\n",
                nccl ? "NCCL, 64 MiB of bf16 per rank on the GPUs" : (world.kind() + ", 16 MiB of floats per rank").c_str());
    std::printf("  %-28s %5s %11s %15s\n", "group", "ranks", "all-gather", "reduce-scatter");
    for (const LinkRow& r : rows)
      std::printf("  %-28s %5d %6.2f GB/s %10.2f GB/s\n", r.group.c_str(), r.ranks, r.busbw.all_gather,
                  r.busbw.reduce_scatter);
  }

  // The plan train would make for this config (dist.sharding, auto measured as train measures it).
  st::AutoShardingInputs inputs;  // as train weighs dist.sharding=auto: NCCL's links and the GPU memory plan on cuda
#ifdef SHARDTRAIN_HAVE_CUDA
  if (nccl) inputs = st::cuda_auto_sharding_inputs(cfg, world);
#endif
  const st::ShardingGroups plan = st::make_sharding_groups(cfg, world, inputs);
  bool copy_engines = false;
#ifdef SHARDTRAIN_HAVE_CUDA
  copy_engines = nccl && st::nccl_has_copy_engine_collectives();
#endif
  if (lead) {
    std::printf("plan: %s\n", plan.why.c_str());
    if (nccl)
      std::printf(
          "  %s\n",
          st::resolve_comm_tuning(cfg.dist, st::shard_link(plan), plan.replica != nullptr, copy_engines).why.c_str());
    std::printf("  per-rank %s (shardtrain plan has every term): this plan %s; full sharding %s; hybrid %s\n",
                nccl ? "device memory" : "host memory", rank_plan(cfg, plan.shard().world_size(), n).c_str(),
                rank_plan(cfg, n, n).c_str(),
                nodes > 1 && even ? rank_plan(cfg, where[0].local_size, n).c_str() : "n/a (needs equal nodes)");
  }
  return st::kExitOk;
}
