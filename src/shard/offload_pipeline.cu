#include "shardtrain/shard/offload_pipeline.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <type_traits>

#include "shardtrain/core/error.h"
#include "shardtrain/core/log.h"
#include "shardtrain/shard/host_plan.h"

namespace st {

template <typename T>
void OffloadPipeline<T>::wait_for_cpu(void* arg) {
  const CpuWait* w = static_cast<const CpuWait*>(arg);
  w->engine->wait(w->ticket);
}

template <typename T>
OffloadPipeline<T>::OffloadPipeline(const Options& o, std::vector<bool> offloaded, std::vector<UnitShard> states,
                                    std::vector<DeviceBuffer<T>> device_copies)
    : mode_(o.mode),
      kind_(std::is_same_v<T, bf16> ? HalfKind::kBF16 : HalfKind::kF16),
      device_(o.device),
      log_(o.log),
      offloaded_(std::move(offloaded)),
      states_(std::move(states)) {
  ST_CHECK((!std::is_same_v<T, float>), "optim.offload needs a half-precision compute type");  // config refuses
  ST_CHECK(states_.size() == offloaded_.size() && device_copies.size() == offloaded_.size(),
           "offload pipeline: ", offloaded_.size(), " units, ", states_.size(), " states, ", device_copies.size(),
           " device copies");
  HostAdamW::Options ho;
  ho.threads = o.threads;
  ho.local_rank = o.local_rank;
  ho.local_size = o.local_size;
  host_adamw_ = std::make_unique<HostAdamW>(ho);
  speculative_ = speculated_units(offloaded_, o.speculated_units);
  speculated_ = static_cast<int>(std::count(speculative_.begin(), speculative_.end(), true));
  units_.resize(offloaded_.size());
  int64_t staged_slot = 0, max_slot = 0;  // max_slot: the largest unit the ring carries
  for (size_t u = 0; u < units_.size(); ++u)
    if (offloaded_[u] && !speculative_[u]) max_slot = std::max(max_slot, states_[u].slot);
  if (max_slot > 0) {
    ring_ = StagingRing(staging_ring_bytes(max_slot, sizeof(T), mode_));
    ring_memory_ = PinnedBuffer<float>(ring_.capacity() / static_cast<int64_t>(sizeof(float)));
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!offloaded_[u]) continue;
    const int64_t slot = states_[u].slot;
    Unit& x = units_[u];
    if (speculative_[u]) x.grad = PinnedBuffer<float>(slot);
    if (speculative_[u] || params_on_host(static_cast<int>(u))) x.out = PinnedBuffer<T>(slot);
    x.device = std::move(device_copies[u]);
    ST_CHECK(params_on_host(static_cast<int>(u)) == (x.device.size() == 0), "offload pipeline: unit ", u,
             params_on_host(static_cast<int>(u)) ? " keeps its parameters on the host but has a device copy"
                                                 : " has no device copy");
    for (CpuWait& w : x.waits) w.engine = host_adamw_.get();
    if (speculative_[u])
      for (std::vector<float>* a : {&x.next_param, &x.next_m, &x.next_v}) a->assign(static_cast<size_t>(slot), 0.0f);
    upload(static_cast<int>(u));
    if (params_on_host(static_cast<int>(u))) staged_slot = std::max(staged_slot, slot);
  }
  if (staged_slot > 0) {
    staging_.resize(2);
    for (Staging& st : staging_) st.data = DeviceBuffer<T>(staged_slot);
  }
  if (max_slot > 0) stager_ = std::thread([this] { run_stager(); });
}

template <typename T>
OffloadPipeline<T>::~OffloadPipeline() {
  if (stager_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(stage_mu_);
      stage_stop_ = true;  // the stager issues what it was given, then returns
    }
    stage_cv_.notify_all();
    stager_.join();
  }
  // Outstanding copies reference the pinned and device buffers; let them finish before those are freed.
  for (const CudaStream* s : {&offload_stream_, &h2d_stream_, &d2h_stream_}) cudaStreamSynchronize(s->get());
  // Host jobs write into the states and the second copies (speculative ones may still run if a step was cut
  // short): finish them before those are freed. Every gradient copy has landed by now, so every gate is open.
  if (host_adamw_) host_adamw_->wait_all();
  if (speculated_ > 0 && log_)
    ST_LOG_INFO("optim.offload_speculative: of ", spec_kept_ + spec_redone_ + spec_dropped_,
                " speculative unit updates, ", spec_kept_, " kept, ", spec_redone_, " redone (clipped), ",
                spec_dropped_, " dropped (skipped steps)");
}

template <typename T>
bool OffloadPipeline<T>::any() const {
  return std::any_of(offloaded_.begin(), offloaded_.end(), [](bool b) { return b; });
}

template <typename T>
UnitShard& OffloadPipeline<T>::state(int unit) {
  wait_all();
  return states_[static_cast<size_t>(unit)];
}

template <typename T>
void OffloadPipeline<T>::wait_all() {
  drain();
  host_adamw_->wait_all();
}

template <typename T>
void OffloadPipeline<T>::hold_updates_until(std::shared_ptr<const std::vector<std::atomic<bool>>> copied) {
  drain();  // the stager reads copied_ when it queues a job: none is being queued now
  copied_ = std::move(copied);
}

template <typename T>
std::string OffloadPipeline<T>::describe(const std::vector<UnitLayout>& units) const {
  int64_t n = 0, params = 0, total = 0;
  for (const UnitLayout& u : units) {
    total += u.numel;
    if (holds(u.index)) ++n, params += u.numel;
  }
  char pct[16];
  std::snprintf(pct, sizeof(pct), "%.1f%%", 100.0 * static_cast<double>(params) / static_cast<double>(total));
  return str_cat(n, " of ", units.size(), " units, ", pct, " of the parameters; host AdamW: ", host_adamw_->describe());
}

// Only while nothing is in flight (construction, or after wait_all() and synchronize()): the ring is idle then.
template <typename T>
T* OffloadPipeline<T>::out_buffer(int unit) {
  Unit& x = units_[static_cast<size_t>(unit)];
  return x.out.size() > 0 ? x.out.data() : reinterpret_cast<T*>(ring_memory_.data());
}

template <typename T>
void OffloadPipeline<T>::upload(int unit) {
  const UnitShard& h = states_[static_cast<size_t>(unit)];
  Unit& x = units_[static_cast<size_t>(unit)];
  T* rounded = out_buffer(unit);
  uint16_t* out = reinterpret_cast<uint16_t*>(rounded);
  for (int64_t i = 0; i < h.slot; ++i) {
    const float v = h.param[static_cast<size_t>(i)];
    out[i] = kind_ == HalfKind::kBF16 ? round_to_bf16(v) : round_to_f16(v);
  }
  if (!params_on_host(unit))
    ST_CUDA_CHECK(
        cudaMemcpy(x.device.data(), rounded, static_cast<size_t>(h.slot) * sizeof(T), cudaMemcpyHostToDevice));
}

template <typename T>
void OffloadPipeline<T>::start_step(cudaStream_t compute) {
  for (Unit& x : units_)
    if (x.grad_on_host) x.grad_copied.wait_on(compute);
  for (Unit& x : units_) x.grad_on_host = false;
}

template <typename T>
void OffloadPipeline<T>::copy_grad_to_host(int unit, const DeviceBuffer<float>& grad, cudaStream_t final_stream) {
  Unit& x = units_[static_cast<size_t>(unit)];
  cudaStream_t ds = d2h_stream_.get();
  final_mark_.record(final_stream);
  final_mark_.wait_on(ds);
  ST_CUDA_CHECK(cudaMemcpyAsync(x.grad.data(), grad.data(), grad.bytes(), cudaMemcpyDeviceToHost, ds));
  x.grad_copied.record(ds);
  x.grad_on_host = true;
}

template <typename T>
void OffloadPipeline<T>::grad_final(int unit, const DeviceBuffer<float>& grad, cudaStream_t final_stream) {
  if (!speculates(unit)) return;
  copy_grad_to_host(unit, grad, final_stream);
  if (!speculative_runs_.empty()) speculate(unit);
}

template <typename T>
HostAdamW::Job OffloadPipeline<T>::job_for(int unit, const std::vector<AdamWRun>& runs) {
  UnitShard& h = states_[static_cast<size_t>(unit)];
  Unit& x = units_[static_cast<size_t>(unit)];
  HostAdamW::Job job;
  job.param = h.param.data();
  job.m = h.m.data();
  job.v = h.v.data();
  job.grad = x.grad.data();
  job.runs = runs;
  job.kind = kind_;
  job.out = reinterpret_cast<uint16_t*>(x.out.data());
  job.priority = unit;  // the next forward needs the first units first
  return job;
}

// A job of a unit whose state a checkpoint still reads (hold_updates_until) opens only once the writer released it.
template <typename T>
void OffloadPipeline<T>::hold_for_snapshot(int unit, HostAdamW::Job* job) const {
  if (!copied_ || (*copied_)[static_cast<size_t>(unit)].load(std::memory_order_acquire)) return;
  job->ready = [copied = copied_, unit, gate = std::move(job->ready)] {
    return (*copied)[static_cast<size_t>(unit)].load(std::memory_order_acquire) && (!gate || gate());
  };
}

template <typename T>
void OffloadPipeline<T>::update(int unit, const std::vector<AdamWRun>& runs, const DeviceBuffer<float>& grad,
                                cudaStream_t final_stream) {
  Unit& x = units_[static_cast<size_t>(unit)];
  if (!speculates(unit)) {
    x.final_mark.record(final_stream);
    give_stager({unit, runs, grad.data(), static_cast<int64_t>(grad.bytes())});
    return;
  }
  if (x.speculated) {
    x.speculated = false;
    if (runs == speculative_runs_[static_cast<size_t>(unit)]) {
      ++spec_kept_;
      // Not clipped: the speculative update is this step's, bit for bit. Its output becomes the state (its job may
      // still be running: everything that reads the state waits for the host AdamW first).
      UnitShard& h = states_[static_cast<size_t>(unit)];
      std::swap(h.param, x.next_param);
      std::swap(h.m, x.next_m);
      std::swap(h.v, x.next_v);
      upload_speculated(unit);
      return;
    }
    // Clipped: drop it (the state it read is untouched; `out` is rewritten) and update again below.
    ++spec_redone_;
    host_adamw_->wait(x.ticket);
  }
  if (!x.grad_on_host) copy_grad_to_host(unit, grad, final_stream);
  x.grad_copied.synchronize();
  HostAdamW::Job job = job_for(unit, runs);
  hold_for_snapshot(unit, &job);
  x.ticket = host_adamw_->submit(std::move(job));
  upload_speculated(unit);
}

template <typename T>
void OffloadPipeline<T>::give_stager(StageRequest r) {
  {
    std::lock_guard<std::mutex> lock(stage_mu_);
    if (stage_error_) std::rethrow_exception(stage_error_);
    ++units_[static_cast<size_t>(r.unit)].requested;
    stage_queue_.push_back(std::move(r));
  }
  stage_cv_.notify_all();
}

// A speculated unit's copy up, once its job (x.ticket) is submitted: behind the updates of the earlier units that do
// not speculate, on the stager, where there are any, so that the offload stream copies the units up in unit order.
template <typename T>
void OffloadPipeline<T>::upload_speculated(int unit) {
  if (!stager_.joinable()) return upload_after_host_update(unit, units_[static_cast<size_t>(unit)].out.data());
  StageRequest r{unit, {}, nullptr, 0};
  r.upload_only = true;
  give_stager(std::move(r));
}

template <typename T>
void OffloadPipeline<T>::run_stager() {
  cudaSetDevice(device_);
  for (;;) {
    StageRequest r;
    {
      std::unique_lock<std::mutex> lock(stage_mu_);
      stage_cv_.wait(lock, [&] { return stage_stop_ || !stage_queue_.empty(); });
      if (stage_queue_.empty()) return;  // stopping, and everything given has been issued
      r = std::move(stage_queue_.front());
      stage_queue_.pop_front();
      stage_busy_ = true;
    }
    std::exception_ptr error;
    try {
      if (!stage_error_) stage(r);  // after an error, only counted, so that no waiter waits forever
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(stage_mu_);
      if (error && !stage_error_) stage_error_ = error;
      ++units_[static_cast<size_t>(r.unit)].staged;
      stage_busy_ = false;
    }
    staged_cv_.notify_all();
  }
}

// On the stager: room in the ring (waiting for the oldest units to give theirs back), the copy down behind the
// gradient's last writer, the job behind the copy, and the copy up behind the job.
template <typename T>
void OffloadPipeline<T>::stage(const StageRequest& r) {
  Unit& x = units_[static_cast<size_t>(r.unit)];
  if (r.upload_only) return upload_after_host_update(r.unit, x.out.data());
  const int64_t slot = states_[static_cast<size_t>(r.unit)].slot;
  const int64_t bytes = staging_unit_bytes(slot, sizeof(T), mode_);
  std::optional<int64_t> at;
  while (!(at = ring_.take(bytes))) {
    const InFlight& oldest = in_flight_.front();
    host_adamw_->wait(oldest.ticket);
    if (!params_on_host(oldest.unit)) units_[static_cast<size_t>(oldest.unit)].uploaded.synchronize();
    ring_.release_oldest();
    in_flight_.pop_front();
  }
  char* base = reinterpret_cast<char*>(ring_memory_.data()) + *at;
  float* grad = reinterpret_cast<float*>(base);
  T* out = params_on_host(r.unit) ? x.out.data() : reinterpret_cast<T*>(base + staging_align(4 * slot));
  cudaStream_t ds = d2h_stream_.get();
  x.final_mark.wait_on(ds);
  ST_CUDA_CHECK(cudaMemcpyAsync(grad, r.grad, static_cast<size_t>(r.bytes), cudaMemcpyDeviceToHost, ds));
  x.grad_copied.record(ds);
  HostAdamW::Job job = job_for(r.unit, r.runs);
  job.grad = grad;
  job.out = reinterpret_cast<uint16_t*>(out);
  const cudaEvent_t landed = x.grad_copied.get();
  const int device = device_;
  job.ready = [landed, device] {  // asked on the host AdamW's workers
    cudaSetDevice(device);
    return cudaEventQuery(landed) != cudaErrorNotReady;
  };
  hold_for_snapshot(r.unit, &job);
  x.ticket = host_adamw_->submit(std::move(job));
  upload_after_host_update(r.unit, out);
  if (!params_on_host(r.unit)) x.uploaded.record(offload_stream_.get());
  in_flight_.push_back({r.unit, x.ticket});
}

template <typename T>
void OffloadPipeline<T>::wait_staged(int unit) {
  if (!stager_.joinable()) return;
  const Unit& x = units_[static_cast<size_t>(unit)];
  std::unique_lock<std::mutex> lock(stage_mu_);
  staged_cv_.wait(lock, [&] { return x.staged == x.requested; });
  if (stage_error_) std::rethrow_exception(stage_error_);
}

template <typename T>
void OffloadPipeline<T>::drain() {
  if (!stager_.joinable()) return;
  std::unique_lock<std::mutex> lock(stage_mu_);
  staged_cv_.wait(lock, [&] { return stage_queue_.empty() && !stage_busy_; });
  if (stage_error_) std::rethrow_exception(stage_error_);
}

// In unit order (the optimizer's), so that the offload stream, which runs these in turn, copies the first units up
// first: the order the host AdamW finishes them in (its priorities) and the next forward needs them in.
template <typename T>
void OffloadPipeline<T>::upload_after_host_update(int unit, const T* out) {
  Unit& x = units_[static_cast<size_t>(unit)];
  CpuWait& w = x.waits[x.submissions++ % 2];
  w.ticket = x.ticket;
  cudaStream_t os = offload_stream_.get();
  ST_CUDA_CHECK(cudaLaunchHostFunc(os, wait_for_cpu, &w));
  if (!params_on_host(unit))
    ST_CUDA_CHECK(cudaMemcpyAsync(x.device.data(), out, x.device.bytes(), cudaMemcpyHostToDevice, os));
  x.params_ready.record(os);
}

// Only the host AdamW runs now; the result goes up to the device when the step keeps it (update(), in unit order:
// queued now, in the backward's reverse order, the offload stream would hold unit 0's copy behind every other).
template <typename T>
void OffloadPipeline<T>::speculate(int unit) {
  Unit& x = units_[static_cast<size_t>(unit)];
  HostAdamW::Job job = job_for(unit, speculative_runs_[static_cast<size_t>(unit)]);
  job.param_out = x.next_param.data();
  job.m_out = x.next_m.data();
  job.v_out = x.next_v.data();
  const cudaEvent_t landed = x.grad_copied.get();
  const int device = device_;
  job.ready = [landed, device] {  // asked on the host AdamW's workers
    cudaSetDevice(device);
    return cudaEventQuery(landed) != cudaErrorNotReady;
  };
  hold_for_snapshot(unit, &job);
  x.ticket = host_adamw_->submit(std::move(job));
  x.speculated = true;
}

template <typename T>
void OffloadPipeline<T>::drop_speculation() {
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& x = units_[u];
    if (!x.speculated) continue;
    x.speculated = false;
    ++spec_dropped_;
    host_adamw_->wait(x.ticket);
    upload(static_cast<int>(u));  // the unchanged state's rounded copy, back in `out` (and on the device)
  }
}

template <typename T>
const T* OffloadPipeline<T>::gather_source(int unit, cudaStream_t comm, bool* staged) {
  wait_staged(unit);  // params_ready is recorded for this step's update
  Unit& x = units_[static_cast<size_t>(unit)];
  *staged = params_on_host(unit);
  if (!*staged) {
    x.params_ready.wait_on(comm);  // the host AdamW's result has been copied up
    return x.device.data();
  }
  // Up from the host into a staging buffer, once the host AdamW is done with it.
  staged_ = &staging_[next_staging_++ % staging_.size()];
  cudaStream_t hs = h2d_stream_.get();
  staged_->free.wait_on(hs);
  x.params_ready.wait_on(hs);
  ST_CUDA_CHECK(cudaMemcpyAsync(staged_->data.data(), x.out.data(), x.out.bytes(), cudaMemcpyHostToDevice, hs));
  staged_->ready.record(hs);
  staged_->ready.wait_on(comm);
  return staged_->data.data();
}

template <typename T>
void OffloadPipeline<T>::gather_issued(cudaStream_t comm) {
  ST_CHECK(staged_ != nullptr, "gather_issued without a staged gather source");
  staged_->free.record(comm);
  staged_ = nullptr;
}

template <typename T>
void OffloadPipeline<T>::push(int unit) {
  wait_all();
  synchronize();  // the ring (where upload() may round to) is idle
  const UnitShard& h = states_[static_cast<size_t>(unit)];
  for (const std::vector<float>* v : {&h.param, &h.m, &h.v})
    ST_CHECK(static_cast<int64_t>(v->size()) == h.slot, "push_unit: unit ", unit, " holds ", v->size(),
             " elements, expected ", h.slot);
  upload(unit);
}

template <typename T>
void OffloadPipeline<T>::synchronize() {
  drain();
  for (const CudaStream* s : {&offload_stream_, &h2d_stream_, &d2h_stream_}) s->synchronize();
}

template class OffloadPipeline<float>;
template class OffloadPipeline<bf16>;
template class OffloadPipeline<fp16>;

}  // namespace st
