#include "shardtrain/shard/cuda_memory_plan.h"

#include <algorithm>

#include "shardtrain/comm/nccl_busbw.h"
#include "shardtrain/core/cuda.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/kernels/gpu/reduce.h"
#include "shardtrain/model/cuda_family.h"
#include "shardtrain/shard/comm_tuning.h"

namespace st {

template <typename T>
ComputeFootprint cuda_compute_footprint(const Config& cfg, int64_t attention_scratch_bytes) {
  const CudaModelFootprint f =
      cuda_model_family<T>(cfg.model.arch)
          .footprint(cfg.model, cfg.train.micro_batch, cfg.train.recompute, attention_scratch_bytes);
  return {f.activation_bytes, f.scratch_bytes + static_cast<int64_t>(gpu::Blas::kDefaultWorkspaceBytes) +
                                  static_cast<int64_t>(gpu::reduce_scratch_bytes())};
}

int64_t device_free_bytes() {
  size_t free_b = 0, total_b = 0;
  ST_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return static_cast<int64_t>(free_b);
}

template <typename T>
MemoryPlan checked_cuda_plan(const Config& cfg, int world, const CommPlan& comm, const std::string& device,
                             int64_t attention_scratch_bytes) {
  const MemoryPlan plan = plan_memory(cfg, world, comm, cuda_compute_footprint<T>(cfg, attention_scratch_bytes));
  check_memory_plan(plan, DeviceBudget::of(cfg, device_free_bytes()), device);
  return plan;
}

namespace {

// Attention's scratch is left out of the plan dist.sharding=auto weighs (it is planned after the sharding, and is a
// few hundred MiB at most); the full check follows once the sharding is chosen.
template <typename T>
AutoShardingInputs cuda_auto_inputs(const Config& cfg, const Communicator& comm) {
  AutoShardingInputs in;
  in.gather_bytes = in.grad_bytes = sizeof(T);
  in.busbw = [](Communicator& group, CollectiveOp op) { return nccl_busbw(group, op); };
  in.fits = [&cfg, device = comm.device_rank()](int group) {
    ST_CUDA_CHECK(cudaSetDevice(device));
    // The link, and with it the default prefetch depth, is known once the sharding is: plan for the deepest default.
    CommPlan c;
    c.prefetch_depth = 0;
    for (LinkKind k : {LinkKind::kNvlink, LinkKind::kPcie, LinkKind::kNetwork})
      c.prefetch_depth = std::max(c.prefetch_depth, default_comm_tuning(k).prefetch_depth);
    if (cfg.dist.prefetch_depth >= 0) c.prefetch_depth = static_cast<int>(cfg.dist.prefetch_depth);
    return plan_memory(cfg, group, c, cuda_compute_footprint<T>(cfg, 0)).total() <=
           DeviceBudget::of(cfg, device_free_bytes()).usable();
  };
  return in;
}

}  // namespace

AutoShardingInputs cuda_auto_sharding_inputs(const Config& cfg, const Communicator& comm) {
  switch (cfg.compute_dtype()) {
    case DType::kF32:
      return cuda_auto_inputs<float>(cfg, comm);
    case DType::kBF16:
      return cuda_auto_inputs<bf16>(cfg, comm);
    case DType::kF16:
      return cuda_auto_inputs<fp16>(cfg, comm);
    case DType::kAuto:
      break;
  }
  ST_CHECK(false, "compute_dtype() returned auto");
  return {};
}

template ComputeFootprint cuda_compute_footprint<float>(const Config&, int64_t);
template ComputeFootprint cuda_compute_footprint<bf16>(const Config&, int64_t);
template ComputeFootprint cuda_compute_footprint<fp16>(const Config&, int64_t);
template MemoryPlan checked_cuda_plan<float>(const Config&, int, const CommPlan&, const std::string&, int64_t);
template MemoryPlan checked_cuda_plan<bf16>(const Config&, int, const CommPlan&, const std::string&, int64_t);
template MemoryPlan checked_cuda_plan<fp16>(const Config&, int, const CommPlan&, const std::string&, int64_t);

}  // namespace st
