#include "shardtrain/shard/model_backend.h"

#include "shardtrain/core/error.h"
#include "shardtrain/shard/sharded_model.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/shard/cuda_sharded_model.h"
#endif

namespace st {

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
