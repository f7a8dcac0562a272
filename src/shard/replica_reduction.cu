#include "shardtrain/shard/replica_reduction.h"

#include <utility>

#include "shardtrain/kernels/gpu/reduce.h"

namespace st {

template <typename T>
ReplicaReduction<T>::ReplicaReduction(std::vector<int64_t> slots, int64_t bucket_elements, NcclCommunicator& replica)
    : buckets_(std::move(slots), bucket_elements),
      replica_(replica),
      bucket_(buckets_.capacity()),
      scratch_(static_cast<int64_t>(gpu::reduce_scratch_bytes())),
      ctx_{stream_.get(), nullptr, scratch_.data(), scratch_.bytes()} {}

template <typename T>
ReplicaReduction<T>::~ReplicaReduction() {
  cudaStreamSynchronize(stream_.get());  // its kernels read and write the buffers freed next
}

template <typename T>
int64_t ReplicaReduction<T>::capacity_for(std::vector<int64_t> slots, int64_t bucket_elements) {
  return ReplicaBuckets(std::move(slots), bucket_elements).capacity();
}

template <typename T>
std::vector<int> ReplicaReduction<T>::add(int unit, DeviceShards<T>& shards, cudaStream_t after,
                                          const ShardingGroups& groups, CommCounters& counters) {
  std::vector<int> finished;
  cudaStream_t rs = stream_.get();
  for (const ReplicaBuckets::Bucket& b : buckets_.add(unit)) {
    after_mark_.record(after);  // the bucket's units are accumulated
    after_mark_.wait_on(rs);
    for (size_t i = 0; i < b.units.size(); ++i) {
      const DeviceBuffer<float>& g = shards.grad(b.units[i]);
      gpu::convert<T>(bucket_.data() + b.offsets[i], g.data(), g.size(), ctx_);
    }
    replica_.all_reduce<T>(bucket_.data(), b.elements, rs);
    for (size_t i = 0; i < b.units.size(); ++i) {
      DeviceBuffer<float>& g = shards.grad(b.units[i]);
      gpu::accumulate<T>(g.data(), bucket_.data() + b.offsets[i], g.size(), ctx_, GradWrite::kOverwrite);
      finished.push_back(b.units[i]);
    }
    counters.replica_reduced_elements += b.elements;
    counters.cross_node_bytes += groups.replica_cross_bytes(b.elements, sizeof(T));
  }
  return finished;
}

template class ReplicaReduction<float>;
template class ReplicaReduction<bf16>;
template class ReplicaReduction<fp16>;

}  // namespace st
