// The NCCL communicators a CUDA rank moves its sharded state with, and the tuning that picks among them: the
// sharding group's (gathers, reduce-scatters, the step's all-reduce), hybrid's replica group (the all-reduce across
// nodes), a split of the sharding group whose reduce-scatters run on at most dist.reduce_scatter_ctas CTAs, and one
// with NCCL's zero-CTA policy for the copy-engine collectives (dist.gather_engine, dist.reduce_engine), which also
// owns the symmetric windows their buffers are carved from (WindowArena).
//
//   ShardCollectives c(cfg.dist, groups, comm);   // binds this rank's GPU; collective
//   ... plan memory with c.tuning() ...
//   c.split(groups.shard());                       // collective over the sharding group
//   c.gather_comm(/*staged=*/false).all_gather<bf16>(src, slot, dst, stream);
#pragma once

#include <cstdint>
#include <memory>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/nccl_communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/error.h"
#include "shardtrain/shard/comm_tuning.h"
#include "shardtrain/shard/sharding.h"

namespace st {

// Device buffers carved in turn out of one symmetric window of `windows` (copy-engine collectives), each at a 256-byte
// boundary. Every rank carves the same sizes in the same order, so a buffer lies at the same offset of its window on
// every rank, as NCCL's symmetric windows require. With `windows` null, each buffer is its own cudaMalloc.
class WindowArena {
 public:
  static int64_t bytes_for(int64_t n, size_t elem) { return (n * static_cast<int64_t>(elem) + 255) / 256 * 256; }
  WindowArena(NcclCommunicator* windows, int64_t bytes) : left_(bytes) {
    if (windows != nullptr && bytes > 0) next_ = static_cast<char*>(windows->window_alloc(static_cast<size_t>(bytes)));
  }
  template <typename U>
  DeviceBuffer<U> take(int64_t n) {
    if (next_ == nullptr) return DeviceBuffer<U>(n);
    const int64_t bytes = bytes_for(n, sizeof(U));
    ST_CHECK(bytes <= left_, "window arena: ", bytes, " bytes asked, ", left_, " left");
    DeviceBuffer<U> b = DeviceBuffer<U>::borrow(reinterpret_cast<U*>(next_), n);
    next_ += bytes;
    left_ -= bytes;
    return b;
  }

 private:
  char* next_ = nullptr;
  int64_t left_ = 0;
};

class ShardCollectives {
 public:
  // The sharding group's communicator (under hybrid split from the world's, as make_sharding_groups split the host
  // communicators) and the replica group's; the tuning resolved for the sharding group's link. Binds this rank's
  // GPU. Collective over `comm`.
  ShardCollectives(const DistConfig& dist, const ShardingGroups& groups, Communicator& comm);

  // Every rank of `shard` takes its rank 0's reduce_scatter_ctas and copy-engine settings (the links each rank
  // classified agree on one machine, but a rank must never be the only one to split), then splits the capped and
  // zero-CTA communicators they ask for. Collective over `shard`; call once, before carving buffers.
  void split(Communicator& shard);

  const CommTuning& tuning() const { return tuning_; }
  NcclCommunicator& shard() { return nccl_; }
  NcclCommunicator* replica() { return replica_.get(); }
  // Where the gathers' buffers and the gradients' buffers are carved from (null: plain allocations).
  NcclCommunicator* gather_windows() { return tuning_.copy_engine_gathers ? ce_.get() : nullptr; }
  NcclCommunicator* grad_windows() { return tuning_.copy_engine_reduce_scatters ? ce_.get() : nullptr; }
  // A gather: on the copy engines when asked for, unless its source lies outside the windows (`staged`).
  NcclCommunicator& gather_comm(bool staged) { return tuning_.copy_engine_gathers && ce_ && !staged ? *ce_ : nccl_; }
  // The copy-engine reduce-scatter's all-to-all (dist.reduce_engine), or null for NCCL's reduce-scatter kernel.
  NcclCommunicator* exchange() { return tuning_.copy_engine_reduce_scatters ? ce_.get() : nullptr; }
  // A reduce-scatter of `unit` with NCCL's kernel: the blocks' and the head's on the capped communicator. The
  // embedding's is the backward's last, and the next step's first gather waits for its update: NCCL's choice.
  NcclCommunicator& reduce_scatter_comm(int unit) { return capped_rs_ && unit != 0 ? *capped_rs_ : nccl_; }

 private:
  std::unique_ptr<NcclCommunicator> world_;    // hybrid, during construction: what the two groups split from
  NcclCommunicator nccl_;                      // over groups.shard()
  std::unique_ptr<NcclCommunicator> replica_;  // hybrid: over groups.replica
  CommTuning tuning_;
  // Over groups.shard() on at most tuning_.reduce_scatter_ctas CTAs; null when that is 0 or the group is one rank.
  std::unique_ptr<NcclCommunicator> capped_rs_;
  // Over groups.shard() with the zero-CTA policy; null when no copy-engine collective is on, or for one rank.
  std::unique_ptr<NcclCommunicator> ce_;
};

}  // namespace st
