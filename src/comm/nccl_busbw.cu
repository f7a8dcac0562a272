#include "shardtrain/comm/nccl_busbw.h"

#include <algorithm>

#include "shardtrain/comm/nccl_communicator.h"
#include "shardtrain/core/cuda.h"

namespace st {

double nccl_busbw(Communicator& group, CollectiveOp op, int64_t bytes) {
  const int n = group.world_size();
  if (n <= 1) return 0.0;
  NcclCommunicator nccl(group);
  const int64_t count = bytes / static_cast<int64_t>(sizeof(bf16));
  DeviceBuffer<bf16> shard(count), full(count * n);
  CudaStream stream;
  zero_async(shard, count, stream.get());
  zero_async(full, count * n, stream.get());
  auto once = [&] {
    switch (op) {
      case CollectiveOp::kAllGather:
        nccl.all_gather<bf16>(shard.data(), count, full.data(), stream.get());
        break;
      case CollectiveOp::kReduceScatter:
        nccl.reduce_scatter<bf16>(full.data(), count, shard.data(), stream.get());
        break;
      case CollectiveOp::kAllReduce:
        nccl.all_reduce<bf16>(shard.data(), count, stream.get());
        break;
    }
  };
  once();  // warm-up: NCCL sets up its channels and buffers on the first call
  ST_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  CudaEvent start(true), stop(true);
  float best_ms = 1e30f;
  for (int i = 0; i < 3; ++i) {
    group.barrier();
    start.record(stream.get());
    once();
    stop.record(stream.get());
    stop.synchronize();
    float ms = 0;
    ST_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    best_ms = std::min(best_ms, ms);
  }
  return bus_bandwidth(op, n, static_cast<double>(count * sizeof(bf16)), best_ms * 1e-3);
}

}  // namespace st
