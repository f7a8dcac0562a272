#include "shardtrain/shard/model_backend.h"

#include <algorithm>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/fp8_history.h"
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

void ModelBackend::pull_state() {
  for (const UnitLayout& u : units()) pull_unit(u.index);
}

void ModelBackend::reserve_snapshot(StateSnapshot* snap) {
  int64_t floats = 0;
  for (const UnitLayout& u : units()) floats += 3 * shard(u.index).span.count;
  if (snap->capacity >= floats) return;
  snap->storage.reset();  // the old block goes before the new one is taken
  snap->storage = std::shared_ptr<float>(new float[static_cast<size_t>(floats)], std::default_delete<float[]>());
  snap->capacity = floats;
}

void ModelBackend::snapshot_state(StateSnapshot* snap) {
  pull_state();
  reserve_snapshot(snap);
  float* at = snap->storage.get();
  snap->units.clear();
  snap->ready = nullptr;
  for (const UnitLayout& u : units()) {
    const UnitShard& sh = shard(u.index);
    const size_t n = static_cast<size_t>(sh.span.count);
    StateSnapshot::Unit su{u.name, sh.span, at, at + n, at + 2 * n};
    std::copy_n(sh.param.data(), n, at);
    std::copy_n(sh.m.data(), n, at + n);
    std::copy_n(sh.v.data(), n, at + 2 * n);
    at += 3 * n;
    snap->units.push_back(std::move(su));
  }
}

void fp8_history_step_end(Fp8AmaxHistory* history, Communicator& comm, bool applied) {
  if (history == nullptr) return;
  if (!applied) {
    history->drop();
    return;
  }
  std::vector<unsigned>& step = history->step_maxima();
  const int world = comm.world_size();
  const auto n = static_cast<int64_t>(step.size());
  if (world > 1 && n > 0) {  // every rank casts the same sites, so each sends the same count; the bits travel as floats
    std::vector<unsigned> all(step.size() * static_cast<size_t>(world));
    comm.all_gather(reinterpret_cast<const float*>(step.data()), n, reinterpret_cast<float*>(all.data()));
    fp8_max_over_ranks(all.data(), world, n, step.data());
  }
  history->push(step);
}

void check_fp8_history_entries(const std::vector<std::vector<float>>& entries, int64_t sites, const std::string& from) {
  const int64_t want = sites * kFp8Operands;
  for (size_t i = 0; i < entries.size(); ++i)
    if (static_cast<int64_t>(entries[i].size()) != want)
      ST_BAD_INPUT(from, ": fp8_amax_history entry ", i, " holds ", entries[i].size(), " maxima; this model has ",
                   sites, " FP8 sites x ", kFp8Operands, " operands = ", want);
}

std::unique_ptr<ModelBackend> make_model_backend(const Config& cfg, Communicator& comm) {
  if (cfg.train.device == Device::kCpu) return std::make_unique<ShardedModel>(cfg, comm);
#ifdef SHARDTRAIN_HAVE_CUDA
  return make_cuda_sharded_model(cfg, comm);
#else
  ST_BAD_INPUT(
      "train.device = cuda, but this shardtrain was built without the CUDA backend (nvcc was not found "
      "at configure time, or -DSHARDTRAIN_CUDA=OFF); use train.device = cpu or rebuild with CUDA");
#endif
}

}  // namespace st
