#include "shardtrain/shard/model_backend.h"

#include "shardtrain/core/error.h"
#include "shardtrain/shard/sharded_model.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/shard/cuda_sharded_model.h"
#endif

namespace st {

// A backend that does not gate on the device is never asked to: StepEngine checks gates_on_device() first.
void ModelBackend::micro_step_queued(const int32_t*, const int32_t*, float) {
  ST_CHECK(false, describe(), ": micro_step_queued() on a backend that does not gate the step on the device");
}
void ModelBackend::queue_gated_update(double, double, float, const std::vector<std::vector<AdamWRun>>&) {
  ST_CHECK(false, describe(), ": queue_gated_update() on a backend that does not gate the step on the device");
}
ModelBackend::GatedStep ModelBackend::finish_gated_step() {
  ST_CHECK(false, describe(), ": finish_gated_step() on a backend that does not gate the step on the device");
  return {};
}

std::unique_ptr<ModelBackend> make_model_backend(const Config& cfg, Communicator& comm) {
  if (cfg.train.device == Device::kCpu) return std::make_unique<ShardedModel>(cfg, comm);
#ifdef SHARDTRAIN_HAVE_CUDA
  return make_cuda_sharded_model(cfg, comm);
#else
  ST_BAD_INPUT("train.device = cuda, but this shardtrain was built without the CUDA backend (nvcc was not found "
               "at configure time, or -DSHARDTRAIN_CUDA=OFF); use train.device = cpu or rebuild with CUDA");
#endif
}

}  // namespace st
