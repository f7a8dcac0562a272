// Hybrid sharding's all-reduce across nodes on the CUDA backend. Each gradient shard is summed across the replicas
// (one rank per node holding the same shard) once per optimizer step, after the last micro-step has accumulated into
// it, so gradient accumulation does not multiply the traffic between nodes. It runs on its own stream, beside the
// node's gathers and reduce-scatters. Shards join buckets in the order they become final (ReplicaBuckets); a
// bucket's shards are rounded to T into one buffer (exact for a single micro-step: the accumulated value is one
// reduce-scatter's output), summed in one call, and written back.
//
//   ReplicaReduction<bf16> r(slots, bucket_elements, replica_nccl);
//   for (int u : r.add(unit, shards, comm_stream, counters, groups)) ... u's shard is final on r.stream() ...
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/comm/nccl_communicator.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/shard/comm_tuning.h"
#include "shardtrain/shard/device_shards.h"
#include "shardtrain/shard/model_backend.h"
#include "shardtrain/shard/sharding.h"

namespace st {

template <typename T>
class ReplicaReduction {
 public:
  // slots: every unit's shard size, in unit order; bucket_elements: dist.bucket_mb resolved, in elements of T.
  ReplicaReduction(std::vector<int64_t> slots, int64_t bucket_elements, NcclCommunicator& replica);
  ~ReplicaReduction();

  // The staging buffer's elements (the memory plan's replica bucket).
  static int64_t capacity_for(std::vector<int64_t> slots, int64_t bucket_elements);

  cudaStream_t stream() const { return stream_.get(); }
  // The replica stream's context, with reduction scratch of its own.
  const gpu::GpuContext& ctx() const { return ctx_; }

  // `unit`'s shard is accumulated for the step's last micro-step once `after` has run what it has queued. It joins
  // a bucket; every bucket that goes out is summed across nodes on stream(). Returns the units whose shards are now
  // final (on stream()), in order; counts the elements and the bytes that cross nodes.
  std::vector<int> add(int unit, DeviceShards<T>& shards, cudaStream_t after, const ShardingGroups& groups,
                       CommCounters& counters);
  // Every unit of this step has gone out (or none has joined yet).
  bool idle() const { return buckets_.joined_units() == 0; }
  // Forgets this step's units (a step abandoned before its backward ended).
  void drop() { buckets_.drop(); }

 private:
  ReplicaBuckets buckets_;
  NcclCommunicator& replica_;
  // At the compute and communication streams' priority, above the device AdamW's (cuda_sharded_model_impl.h).
  CudaStream stream_{CudaStream::Priority::kHigh};
  DeviceBuffer<T> bucket_;               // one bucket of gradient shards in T
  DeviceBuffer<unsigned char> scratch_;  // the replica stream's reductions
  gpu::GpuContext ctx_;
  CudaEvent after_mark_;
};

}  // namespace st
