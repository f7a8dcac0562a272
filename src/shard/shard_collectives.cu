#include "shardtrain/shard/shard_collectives.h"

namespace st {
namespace {

// The NCCL communicator of groups.shard(): the world's own under full sharding; in hybrid split from `world` as
// make_sharding_groups split the host communicators (node_split).
NcclCommunicator shard_nccl(const ShardingGroups& g, Communicator& comm, NcclCommunicator* world) {
  if (world == nullptr) return NcclCommunicator(g.shard());
  const SplitSpec s = node_split(comm);
  return NcclCommunicator(*world, *g.node, s.color, s.key);
}

// Hybrid's replica groups the same way (replica_split); null under full sharding.
std::unique_ptr<NcclCommunicator> replica_nccl(const ShardingGroups& g, Communicator& comm, NcclCommunicator* world) {
  if (world == nullptr) return nullptr;
  const SplitSpec s = replica_split(comm);
  return std::make_unique<NcclCommunicator>(*world, *g.replica, s.color, s.key);
}

}  // namespace

ShardCollectives::ShardCollectives(const DistConfig& dist, const ShardingGroups& groups, Communicator& comm)
    : world_(groups.replica ? std::make_unique<NcclCommunicator>(comm) : nullptr),  // binds this rank's GPU
      nccl_(shard_nccl(groups, comm, world_.get())),  // binds this rank's GPU before anything is allocated
      replica_(replica_nccl(groups, comm, world_.get())),
      tuning_(resolve_comm_tuning(dist, shard_link(groups), groups.replica != nullptr,
                                  nccl_has_copy_engine_collectives())) {
  world_.reset();  // the groups are split off; they keep no tie to it
}

void ShardCollectives::split(Communicator& shard) {
  ST_CHECK(!capped_rs_ && !ce_, "ShardCollectives::split called twice");
  const int world = shard.world_size(), rank = shard.rank();
  int32_t settings[3] = {tuning_.reduce_scatter_ctas, tuning_.copy_engine_gathers ? 1 : 0,
                         tuning_.copy_engine_reduce_scatters ? 1 : 0};
  shard.broadcast(settings, sizeof(settings), 0);
  tuning_.reduce_scatter_ctas = settings[0];
  tuning_.copy_engine_gathers = settings[1] != 0;
  tuning_.copy_engine_reduce_scatters = settings[2] != 0;
  if (tuning_.reduce_scatter_ctas > 0 && world > 1) {
    NcclSplitOptions o;
    o.max_ctas = tuning_.reduce_scatter_ctas;
    capped_rs_ = std::make_unique<NcclCommunicator>(nccl_, shard, /*color=*/0, rank, o);
  }
  if ((tuning_.copy_engine_gathers || tuning_.copy_engine_reduce_scatters) && world > 1) {
    NcclSplitOptions o;
    o.zero_cta = true;
    ce_ = std::make_unique<NcclCommunicator>(nccl_, shard, /*color=*/0, rank, o);
  }
}

}  // namespace st
