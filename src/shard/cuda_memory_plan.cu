#include "shardtrain/shard/cuda_memory_plan.h"

#include "shardtrain/comm/nccl_busbw.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/error.h"
#include "shardtrain/shard/plan_search.h"
#include "shardtrain/shard/run_plan.h"

namespace st {

int64_t device_free_bytes() {
  size_t free_b = 0, total_b = 0;
  ST_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(free_b);
}

int64_t visible_device_free_bytes() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    (void)cudaGetLastError();  // no device: not an error to carry into later calls
    return -1;
  }
  ST_CUDA_CHECK(cudaSetDevice(0));
  return device_free_bytes();
}

MemoryPlan checked_cuda_plan(const Config& cfg, int world, bool hybrid, const CommPlan& comm, RunTarget run,
                             int64_t attention_scratch_bytes) {
  const int64_t bound = attention_scratch_bound(cfg);
  ST_CHECK(attention_scratch_bytes <= bound, "cuDNN's attention asks for ", attention_scratch_bytes,
           " bytes of kernel scratch at micro_batch ", cfg.train.micro_batch, " x seq_len ", cfg.model.seq_len,
           ", above the ", bound,
           " the memory plan allows it (cudnn_attention_scratch_bound); set "
           "train.attention=flash");
  run.device = DeviceBudget::of(cfg, device_free_bytes());
  check_memory_plan(planned_cuda_device(cfg, world, hybrid), run.device, run.device_name,
                    [&] { return misfit_advice(cfg, run); });
  return plan_memory(cfg, world, comm, cuda_compute_footprint(cfg, attention_scratch_bytes));
}

AutoShardingInputs cuda_auto_sharding_inputs(const Config& cfg, const Communicator& comm) {
  AutoShardingInputs in;
  in.grad_bytes = dtype_bytes(cfg.compute_dtype());
  in.busbw = [](Communicator& group, CollectiveOp op) { return nccl_busbw(group, op); };
  in.fits = [&cfg, device = comm.device_rank(), world = comm.world_size()](int group) {
    ST_CUDA_CHECK(cudaSetDevice(device));
    return planned_cuda_device(cfg, group, group < world).total() <=
           DeviceBudget::of(cfg, device_free_bytes()).usable();
  };
  return in;
}

}  // namespace st
