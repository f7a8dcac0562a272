// CudaShardedModel's state in and out: full units gathered for the host, the sharded state pulled to the host and
// pushed back one unit at a time, and snapshots: device-resident units copied to pinned memory beside the next step,
// offloaded ones read in place.
#include <algorithm>
#include <atomic>
#include <memory>

#include "cuda_sharded_model_impl.h"

namespace st::shard_internal {

template <typename T>
template <typename E>
void CudaShardedModel<T>::gather_to_host(const E* source, bool source_on_host, int64_t slot, E* dst) {
  // Every rank cuts its slot into the same pieces, so that each all-gather pairs up across the ranks.
  const int world = coll_.shard().world_size();
  const int64_t piece = std::max<int64_t>(1, std::min<int64_t>(slot, kGatherPieceBytes / sizeof(E) / world));
  cudaStream_t cs = compute_stream_.get();
  DeviceBuffer<E> gathered(piece * world), staged(source_on_host ? piece : 0);
  for (int64_t at = 0; at < slot; at += piece) {
    const int64_t n = std::min(piece, slot - at);
    const E* send = source + at;
    if (source_on_host) {
      ST_CUDA_CHECK(cudaMemcpyAsync(staged.data(), send, sizeof(E) * n, cudaMemcpyHostToDevice, cs));
      send = staged.data();
    }
    coll_.shard().template all_gather<E>(send, n, gathered.data(), cs);
    // Rank r's n elements land at gathered + r n and belong at dst + r slot + at: a copy each (a 2D copy's pitch,
    // slot elements, may pass the device's largest, 2^31 - 1 bytes).
    for (int r = 0; r < world; ++r)
      ST_CUDA_CHECK(
          cudaMemcpyAsync(dst + r * slot + at, gathered.data() + r * n, sizeof(E) * n, cudaMemcpyDeviceToHost, cs));
    compute_stream_.synchronize();  // the buffers take the next piece
  }
}

template <typename T>
std::vector<float> CudaShardedModel<T>::gather_full(int unit, bool grads) {
  const UnitShard& h = shards_->view(unit);
  if (h.slot == 0) return {};  // wholly frozen
  optimizer_.synchronize();    // the master as the last AdamW left it
  std::vector<float> out(static_cast<size_t>(h.slot * coll_.shard().world_size()));
  if (!grads && offload(unit)) {  // optim.offload: the master is on the host
    gather_to_host(offload_->state(unit).param.data(), /*source_on_host=*/true, h.slot, out.data());
  } else {
    gather_to_host<float>(grads ? shards_->grad(unit).data() : shards_->master(unit), false, h.slot, out.data());
  }
  out.resize(static_cast<size_t>(units_[static_cast<size_t>(unit)].numel));
  return out;
}

template <typename T>
std::vector<float> CudaShardedModel<T>::gather_frozen(int unit) {
  const UnitShard& h = shards_->view(unit);
  const UnitLayout& u = units_[static_cast<size_t>(unit)];
  if (u.nf4_base) {  // the storage itself, dequantised as the CPU backend does (fp32)
    std::vector<float> words(static_cast<size_t>(h.nf4_slot * coll_.shard().world_size()));
    gather_to_host(shards_->nf4_source(unit), false, h.nf4_slot * 4, reinterpret_cast<uint8_t*>(words.data()));
    std::vector<float> out(static_cast<size_t>(u.frozen_numel));
    nf4_dequantize_unit(u, shards_->nf4_storage(unit), storage_bytes(words), out.data());
    return out;
  }
  if (h.frozen_slot == 0) return {};
  std::vector<T> raw(static_cast<size_t>(h.frozen_slot * coll_.shard().world_size()));
  gather_to_host(shards_->frozen_source(unit), false, h.frozen_slot, raw.data());
  std::vector<float> out(static_cast<size_t>(u.frozen_numel));
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(raw[i]);
  return out;
}

// Whatever may still write a unit's state (or, for a snapshot, read it) has finished: the streams, the optimizer and
// the host AdamW of the offloaded units. Cheap when idle, so each unit's pull and push calls it.
template <typename T>
void CudaShardedModel<T>::quiesce_state() {
  if (offload_) {
    offload_->wait_all();
    offload_->synchronize();
  }
  for (const CudaStream* st : {&compute_stream_, &comm_stream_, &snapshot_stream_}) st->synchronize();
  if (replica_) ST_CUDA_CHECK(cudaStreamSynchronize(replica_->stream()));
  optimizer_.synchronize();
}

template <typename T>
void CudaShardedModel<T>::pull_unit(int unit) {
  ++params_epoch_;
  quiesce_state();
  if (!offload(unit)) shards_->pull(unit);  // an offloaded unit's param, m and v are on the host already
  shards_->pull_frozen(unit, shard(unit));  // the frozen base is always on the device
}

template <typename T>
void CudaShardedModel<T>::release_unit(int unit) {
  if (!offload(unit)) return shards_->release_view(unit);
  std::vector<float>().swap(shard(unit).frozen);  // the host state stays: it is the state
}

// Device-resident units are copied into pinned memory on a stream of their own, behind this step's AdamW (an event
// on the optimizer stream), last unit first: the order in which the next step's backward finishes them. Each unit's
// next AdamW waits for its own copy alone (device_adamw), so the copy engine moves the state while the next step's
// forward and backward run. Offloaded units live in host memory already: the snapshot points at their state, and
// their next host updates wait until the writer has released it (no second copy of the largest part of the state).
template <typename T>
void CudaShardedModel<T>::reserve_snapshot(StateSnapshot* snap) {
  int64_t floats = 0;
  for (int u = 0; u < static_cast<int>(shards_->size()); ++u)
    if (!offload(u)) floats += 3 * shard(u).span.count;
  if (snap->capacity >= floats) return;
  snap->storage.reset();
  float* p = nullptr;
  if (floats > 0)
    ST_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p), static_cast<size_t>(floats) * sizeof(float)));
  snap->storage = std::shared_ptr<float>(p, [](float* q) { cudaFreeHost(q); });
  snap->capacity = floats;
}

template <typename T>
void CudaShardedModel<T>::check_snapshot_released(const char* caller) const {
  if (snapshot_held_)
    for (const std::atomic<bool>& h : *snapshot_held_)
      ST_CHECK(h.load(std::memory_order_acquire), caller, " while a checkpoint still writes the offloaded state");
}

template <typename T>
void CudaShardedModel<T>::snapshot_state(StateSnapshot* snap) {
  check_snapshot_released("snapshot_state");  // a new hold would free the units the last writer still reads
  reserve_snapshot(snap);
  if (offload_) offload_->wait_all();  // this step's host updates
  const int n_units = static_cast<int>(shards_->size());
  snapshot_copied_.resize(static_cast<size_t>(n_units));
  snapshot_fence_.assign(static_cast<size_t>(n_units), false);
  cudaStream_t cs = snapshot_stream_.get();
  snapshot_after_.record(optimizer_.stream());
  snapshot_after_.wait_on(cs);
  snap->units.assign(static_cast<size_t>(n_units), StateSnapshot::Unit{});
  auto held = std::make_shared<std::vector<std::atomic<bool>>>(static_cast<size_t>(n_units));
  bool any_held = false;
  float* at = snap->storage.get();
  for (int u = n_units - 1; u >= 0; --u) {
    const UnitShard& view = shard(u);
    const int64_t n = view.span.count;
    StateSnapshot::Unit& su = snap->units[static_cast<size_t>(u)];
    (*held)[static_cast<size_t>(u)].store(!offload(u), std::memory_order_relaxed);
    if (offload(u)) {
      su = {units_[static_cast<size_t>(u)].name, view.span, view.param.data(), view.m.data(), view.v.data()};
      any_held = true;
      continue;
    }
    float* dst = at;
    at += 3 * n;
    su = {units_[static_cast<size_t>(u)].name, view.span, dst, dst + n, dst + 2 * n};
    const size_t bytes = static_cast<size_t>(n) * sizeof(float);
    const typename DeviceOptimizer<T>::UnitState d = shards_->optimizer_state(u);
    ST_CUDA_CHECK(cudaMemcpyAsync(dst, d.master, bytes, cudaMemcpyDeviceToHost, cs));
    ST_CUDA_CHECK(cudaMemcpyAsync(dst + n, d.m, bytes, cudaMemcpyDeviceToHost, cs));
    ST_CUDA_CHECK(cudaMemcpyAsync(dst + 2 * n, d.v, bytes, cudaMemcpyDeviceToHost, cs));
    snapshot_copied_[static_cast<size_t>(u)].record(cs);
    snapshot_fence_[static_cast<size_t>(u)] = true;
  }
  snap->release = nullptr;
  if (any_held) {
    offload_->hold_updates_until(held);
    snapshot_held_ = held;
    snap->release = [held] {
      for (std::atomic<bool>& h : *held) h.store(true, std::memory_order_release);
    };
  }
  auto device_copied = std::make_shared<CudaEvent>();
  device_copied->record(cs);
  int device = 0;
  ST_CUDA_CHECK(cudaGetDevice(&device));
  snap->ready = [device_copied, device] {
    ST_CUDA_CHECK(cudaSetDevice(device));  // the waiting thread may be another than the one that trains
    device_copied->synchronize();
  };
}

template <typename T>
void CudaShardedModel<T>::push_unit(int unit) {
  ++params_epoch_;
  if (embedding_prefetched_) {  // gathered from the shard a push may replace
    release_params(0);
    embedding_prefetched_ = false;
  }
  check_snapshot_released("push_unit");
  quiesce_state();  // nothing in flight may still write the buffers replaced here, nor read them for a snapshot
  if (offload(unit))
    offload_->push(unit);  // the host state is the state: only the compute copy follows it
  else
    shards_->push(unit, ctx_);
  shards_->push_frozen(unit, shard(unit), ctx_);
  compute_stream_.synchronize();  // the copies from the view have landed
  release_unit(unit);             // the device holds the state now; pull_unit() fills the view again
}

// The members defined here, for each compute type (the class itself is instantiated in cuda_sharded_model.cu).
#define ST_INSTANTIATE_STATE(T)                                                  \
  template std::vector<float> CudaShardedModel<T>::gather_full(int, bool);       \
  template std::vector<float> CudaShardedModel<T>::gather_frozen(int);           \
  template void CudaShardedModel<T>::quiesce_state();                            \
  template void CudaShardedModel<T>::pull_unit(int);                             \
  template void CudaShardedModel<T>::release_unit(int);                          \
  template void CudaShardedModel<T>::reserve_snapshot(StateSnapshot*);           \
  template void CudaShardedModel<T>::check_snapshot_released(const char*) const; \
  template void CudaShardedModel<T>::snapshot_state(StateSnapshot*);             \
  template void CudaShardedModel<T>::push_unit(int);
ST_INSTANTIATE_STATE(float)
ST_INSTANTIATE_STATE(bf16)
ST_INSTANTIATE_STATE(fp16)
#undef ST_INSTANTIATE_STATE

}  // namespace st::shard_internal
