// CudaShardedModel's optimizer step: the gradient norm, AdamW of each unit on the device or the host, the gated step
// that the device decides without a round trip to the host, and the step's end for train.fp8=delayed's history.
#include <algorithm>

#include "cuda_sharded_model_impl.h"
#include "shardtrain/kernels/gpu/fp8_history.h"

namespace st::shard_internal {

template <typename T>
double CudaShardedModel<T>::grad_sum_of_squares() {
  // With every unit's share taken as its gradient became final (finish_grad), the compute stream has waited for
  // those streams (run()); else the shards are read here. The same bits either way.
  std::vector<typename DeviceOptimizer<T>::GradView> grads;
  for (int u = 0; u < static_cast<int>(shards_->size()); ++u)
    grads.push_back({shards_->grad(u).data(), shards_->view(u).span.count});
  return optimizer_.sum_of_squares(grads, ctx_);
}

template <typename T>
void CudaShardedModel<T>::check_runs(int unit, const std::vector<AdamWRun>& runs) const {
  const int64_t owned = shards_->view(unit).span.count;
  for (const AdamWRun& r : runs)
    ST_CHECK(r.offset >= 0 && r.offset + r.count <= owned, "AdamW run [", r.offset, ", +", r.count, ") outside unit ",
             unit, "'s span of ", owned);
}

template <typename T>
void CudaShardedModel<T>::adamw(int unit, const std::vector<AdamWRun>& runs) {
  check_runs(unit, runs);
  if (offload(unit)) {
    ++params_epoch_;  // device_adamw moves it for the others
    // Queued on the host AdamW; the offload stream waits for it and copies the new shard up, and the next gather of
    // this unit waits for that. This thread goes on to the next unit, then to the next step.
    offload_->update(unit, runs, shards_->grad(unit), final_grad_stream());
    if (unit == 0 && !embedding_prefetched_) prefetch_embedding();
    return;
  }
  device_adamw(unit, runs, nullptr);
}

// On the optimizer stream, after what the compute stream has queued (the step's final gradients, their norm, the
// gate), so that the next step's forward starts once unit 0 is updated and gathered, while the other units update.
template <typename T>
void CudaShardedModel<T>::device_adamw(int unit, const std::vector<AdamWRun>& runs, const StepGate* gate) {
  ++params_epoch_;
  if (unit < static_cast<int>(snapshot_fence_.size()) && snapshot_fence_[static_cast<size_t>(unit)]) {
    snapshot_copied_[static_cast<size_t>(unit)].wait_on(optimizer_.stream());  // the snapshot has this unit's state
    snapshot_fence_[static_cast<size_t>(unit)] = false;
  }
  optimizer_.update(unit, shards_->optimizer_state(unit), runs, gate, compute_stream_.get());
  if (unit == 0 && !embedding_prefetched_) prefetch_embedding();
}

// The norm's parts were taken as each gradient became final (finish_grad); summed in order as grad_sum_of_squares
// does, all-reduced with the losses over the sharding group, decided on, and every unit's AdamW queued behind the
// decision.
template <typename T>
void CudaShardedModel<T>::queue_gated_update(double earlier_losses, double loss_scale, float grad_clip,
                                             const std::vector<std::vector<AdamWRun>>& runs) {
  ST_CHECK(loss_queued_ && !gate_queued_, "queue_gated_update without a queued last micro-step");
  ST_CHECK(runs.size() == shards_->size(), "queue_gated_update: runs for ", runs.size(), " units, the model has ",
           shards_->size());
  for (size_t u = 0; u < runs.size(); ++u) check_runs(static_cast<int>(u), runs[u]);
  optimizer_.queue_gate(earlier_losses, loss_scale, grad_clip, coll_.shard(), coll_.replica(), ctx_);
  loss_queued_ = false;
  gate_queued_ = true;
  for (size_t u = 0; u < shards_->size(); ++u) device_adamw(static_cast<int>(u), runs[u], optimizer_.gate());
}

template <typename T>
ModelBackend::GatedStep CudaShardedModel<T>::finish_gated_step() {
  ST_CHECK(gate_queued_, "finish_gated_step without queue_gated_update");
  gate_queued_ = false;
  GatedStep g;
  g.gate = optimizer_.finish_gate(&g.last_loss_sum);  // the decision, not the AdamW behind it
  after_sync();
  return g;
}

// train.fp8=delayed: the step's maxima all-gathered over the sharding group (and hybrid's replica group: every rank
// of the world, in two hops) and reduced, then pushed; all on the compute stream, behind the step's casts and before
// the next step's. With dist.fp8_gather the gathers cast the weights by the history too (fp8_gatherer.h): the
// communication stream then follows the push, so that the next step's gathers read the new history.
template <typename T>
void CudaShardedModel<T>::fp8_step_end(bool applied) {
  ++params_epoch_;
  CudaFp8History* h = model_->fp8_history();
  if (h == nullptr) return;
  if (!applied) {
    h->drop(ctx_);
    gathers_follow_fp8_step_end();
    return;
  }
  const int64_t n = h->entry_size();
  const int most = std::max(coll_.shard().world_size(), coll_.replica() ? coll_.replica()->world_size() : 1);
  if (fp8_gathered_.size() < n * most) fp8_gathered_ = DeviceBuffer<unsigned>(n * most);  // once: a few KB
  for (NcclCommunicator* group : {&coll_.shard(), coll_.replica()}) {
    if (group == nullptr || group->world_size() == 1 || n == 0) continue;
    const int world = group->world_size();
    group->template all_gather<float>(reinterpret_cast<const float*>(h->step_maxima()), n,
                                      reinterpret_cast<float*>(fp8_gathered_.data()), ctx_.stream);
    gpu::fp8_max_over_ranks(fp8_gathered_.data(), world, n, h->step_maxima(), ctx_);
  }
  h->push(h->step_maxima(), ctx_);
  gathers_follow_fp8_step_end();
}

template <typename T>
void CudaShardedModel<T>::gathers_follow_fp8_step_end() {
  if (!fp8_gather_) return;
  fp8_step_ended_.record(ctx_.stream);
  fp8_step_ended_.wait_on(comm_stream_.get());
}

template <typename T>
std::vector<std::vector<float>> CudaShardedModel<T>::fp8_history() {
  CudaFp8History* h = model_->fp8_history();
  return h == nullptr ? std::vector<std::vector<float>>{} : h->entries(ctx_);
}

template <typename T>
void CudaShardedModel<T>::load_fp8_history(const std::vector<std::vector<float>>& entries, const std::string& from) {
  ++params_epoch_;
  CudaFp8History* h = model_->fp8_history();
  if (h == nullptr) return;
  check_fp8_history_entries(entries, h->sites(), from);
  h->load(entries, ctx_);
}

// The members defined here, for each compute type (the class itself is instantiated in cuda_sharded_model.cu).
#define ST_INSTANTIATE_OPTIMIZER(T)                                                                    \
  template double CudaShardedModel<T>::grad_sum_of_squares();                                          \
  template void CudaShardedModel<T>::check_runs(int, const std::vector<AdamWRun>&) const;              \
  template void CudaShardedModel<T>::adamw(int, const std::vector<AdamWRun>&);                         \
  template void CudaShardedModel<T>::device_adamw(int, const std::vector<AdamWRun>&, const StepGate*); \
  template void CudaShardedModel<T>::queue_gated_update(double, double, float,                         \
                                                        const std::vector<std::vector<AdamWRun>>&);    \
  template ModelBackend::GatedStep CudaShardedModel<T>::finish_gated_step();                           \
  template void CudaShardedModel<T>::fp8_step_end(bool);                                               \
  template void CudaShardedModel<T>::gathers_follow_fp8_step_end();                                    \
  template std::vector<std::vector<float>> CudaShardedModel<T>::fp8_history();                         \
  template void CudaShardedModel<T>::load_fp8_history(const std::vector<std::vector<float>>&, const std::string&);
ST_INSTANTIATE_OPTIMIZER(float)
ST_INSTANTIATE_OPTIMIZER(bf16)
ST_INSTANTIATE_OPTIMIZER(fp16)
#undef ST_INSTANTIATE_OPTIMIZER

}  // namespace st::shard_internal
