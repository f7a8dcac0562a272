// Bus bandwidth of a group's links as NCCL sees them: what dist.sharding=auto weighs on GPUs and what
// `shardtrain topo` prints for a cuda config.
//
//   const double gbs = nccl_busbw(node_group, CollectiveOp::kAllGather);   // collective over node_group
#pragma once

#include <cstdint>

#include "shardtrain/comm/communicator.h"

namespace st {

// nccl-tests' bus bandwidth in GB/s of `op` over the ranks of `group`: a temporary NcclCommunicator over it
// (binding this rank's GPU), `bytes` of bf16 per rank, the fastest of 3 calls after a warm-up, each timed with
// CUDA events after a host barrier. 0 for a group of one. Collective over `group`.
double nccl_busbw(Communicator& group, CollectiveOp op, int64_t bytes = int64_t{64} << 20);

}  // namespace st
