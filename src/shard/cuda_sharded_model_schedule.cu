// CudaShardedModel as run_schedule's executor: a micro-step, an evaluation or a logits pass runs the schedule, whose
// gathers and reduce-scatters go on the communication stream, ahead of and behind the compute stream's units.
#include <algorithm>

#include "cuda_sharded_model_impl.h"
#include "shardtrain/comm/nccl_communicator.h"
#include "shardtrain/kernels/gpu/reduce.h"

namespace st::shard_internal {

namespace {

bool is_compute_op(OpKind k) {
  return k == OpKind::kForward || k == OpKind::kBackward || k == OpKind::kHeadForwardBackward;
}

}  // namespace

template <typename T>
void CudaShardedModel<T>::zero_grads() {
  // No memset: the next micro-step's reduce-scatters overwrite the shards (fresh_grads_). They run on the
  // communication stream after the compute stream's backward ops, so the previous step's copies of the gradients to
  // the host are done before they do: the compute stream waits for those (start_step; with
  // optim.offload_speculative the optimizer does not wait for them).
  if (offload_) offload_->start_step(compute_stream_.get());
  ++params_epoch_;  // the optimizer and the history's step end came before
  fresh_grads_ = true;
  optimizer_.reset_norm();
  summed_across_nodes_ = false;
  if (replica_) replica_->drop();  // a step cut short (an exception in its backward) left units in a bucket
}

template <typename T>
void CudaShardedModel<T>::issue_gather(int unit) {
  Buffer* b = &buffers_->take_params(unit);
  const int64_t slot = shards_->view(unit).slot;
  cudaStream_t ns = comm_stream_.get();
  const bool in_place = in_place_[static_cast<size_t>(unit)];
  if (!in_place) b->free.wait_on(ns);  // the unit that held it has finished computing
  optimizer_.wait_updated(unit, ns);   // the shard its device AdamW writes (optimizer stream)
  bool staged = false;                 // optim.offload=optimizer+params: a staging buffer filled from the host
  const int world = coll_.shard().world_size();
  int64_t received = 0;  // bytes
  // A segment in FP8 (dist.fp8_gather: fp8_gatherer.h), or in T: the trainable slots, then the frozen tensors (LoRA's
  // base) from element numel on, over the trainable slots' padding (units.h).
  const int64_t epoch = mode_ == Mode::kTrain ? params_epoch_ : -1;  // dist.fp8_gather_keep's
  const auto gather_segment = [&](int segment, const T* source, int64_t count, T* dst, bool from_staging) {
    if (fp8_gather_ && fp8_gather_->applies(unit, segment)) {
      received += fp8_gather_->gather(unit, segment, source, b->data.data(), coll_.shard(), comm_ctx_,
                                      model_->fp8_history(), epoch);
      return;
    }
    coll_.gather_comm(from_staging).all_gather<T>(source, count, dst, ns);
    received += count * world * static_cast<int64_t>(sizeof(T));
  };
  if (in_place) {  // the unit reads its shard once its AdamW has written it (above); counted as the gather it replaces
    received += slot * static_cast<int64_t>(sizeof(T));
  } else if (slot > 0) {
    // A kept block (dist.fp8_gather_keep) needs no source: optim.offload=optimizer+params uploads none for it.
    const bool kept = fp8_gather_ && fp8_gather_->kept(unit, 0, epoch);
    const T* source = kept            ? nullptr
                      : offload(unit) ? offload_->gather_source(unit, ns, &staged)
                                      : shards_->gather_source(unit);
    gather_segment(0, source, slot, b->data.data(), staged);
    if (staged) offload_->gather_issued(ns);
  }
  const int64_t frozen_slot = shards_->view(unit).frozen_slot;
  if (frozen_slot > 0)
    gather_segment(1, shards_->frozen_source(unit), frozen_slot,
                   b->data.data() + units_[static_cast<size_t>(unit)].numel, false);
  // An NF4 unit's storage, gathered as bytes and dequantised there on this stream (one staging buffer serves every
  // unit: the gathers are in order on this stream).
  const int64_t nf4_slot = shards_->view(unit).nf4_slot;
  if (nf4_slot > 0) {
    const uint8_t* storage = shards_->nf4_source(unit);
    if (world > 1) {
      coll_.gather_comm(false).all_gather<uint8_t>(storage, nf4_slot * 4, nf4_full_.data(), ns);
      storage = nf4_full_.data();
      received += nf4_slot * 4 * world;
    }
    shards_->dequantize_nf4(unit, storage, b->data.data() + units_[static_cast<size_t>(unit)].numel, comm_ctx_);
  }
  b->ready.record(ns);
  ++counters_.gathers[static_cast<size_t>(unit)];
  counters_.gathered_elements += (slot + frozen_slot + nf4_slot) * world;
  counters_.gathered_bytes += received;
  counters_.cross_node_bytes += groups_.shard_cross_bytes(received / world, 1);  // what each rank sends
}

// Issues, in schedule order, every gather that lies at most prefetch_depth compute ops ahead of `at` and has a free
// buffer: the next units' parameters arrive while the current one computes. Every rank makes the same decisions,
// so the NCCL calls match across ranks.
template <typename T>
void CudaShardedModel<T>::prefetch(const std::vector<ScheduleOp>& schedule, size_t at) {
  int computes = 0;
  size_t i = at;
  for (; i < next_gather_; ++i) computes += is_compute_op(schedule[i].kind) ? 1 : 0;
  for (; i < schedule.size(); ++i) {
    const ScheduleOp& op = schedule[i];
    if (op.kind == OpKind::kGather) {
      // A unit still held from an earlier op (the last block, between its forward and its backward's gather) must
      // be released before it is gathered again; so must a buffer be free.
      if (!buffers_->can_take_params(op.unit)) return;
      issue_gather(op.unit);
      next_gather_ = i + 1;
    } else if (is_compute_op(op.kind) && ++computes > coll_.tuning().prefetch_depth) {
      return;
    }
  }
}

template <typename T>
const T* CudaShardedModel<T>::gathered(int unit) {
  Buffer* b = buffers_->params(unit);
  ST_CHECK(b != nullptr, "unit ", unit, " used without being gathered");
  wait_for_comm(b->ready, unit == 0 ? "comm_wait.gather_embedding" : "comm_wait.gather");
  return in_place_[static_cast<size_t>(unit)] ? shards_->gather_source(unit) : b->data.data();
}

template <typename T>
T* CudaShardedModel<T>::full_grad(int unit) {
  Buffer* slot = buffers_->grads(unit);
  if (slot == nullptr) {  // first use in this micro-step
    slot = &buffers_->take_grads(unit);
    cudaStream_t cs = compute_stream_.get();
    wait_for_comm(slot->free, "comm_wait.grad_buffer");  // its previous reduce-scatter has read it
    // Only the embedding's is zeroed: a tied classifier and the token lookup add to it. A block's and the head's
    // backward write theirs (cuda_unit_model.h). What lies past a unit's elements goes into the reduce-scatter's
    // padding, which nothing reads.
    if (unit == 0) {
      const int64_t n = shards_->view(0).slot * coll_.shard().world_size();
      if (n > 0) zero_async(slot->data, n, cs);
    }
  }
  return slot->data.data();
}

template <typename T>
void CudaShardedModel<T>::reduce_scatter(int unit) {
  Buffer* b = buffers_->grads(unit);
  ST_CHECK(b != nullptr, "reduce-scatter of unit ", unit, " without a gradient");
  const UnitShard& h = shards_->view(unit);
  cudaStream_t ns = comm_stream_.get();
  b->ready.record(compute_stream_.get());
  b->ready.wait_on(ns);
  if (h.slot == 0) {  // wholly frozen (LoRA's embedding and head): nothing to reduce; its share of the norm is 0
    if (last_micro_) finish_grad(unit, /*norm_taken=*/false);
    buffers_->release_grads(unit, ns);
    return;
  }
  const GradWrite write = fresh_grads_ ? GradWrite::kOverwrite : GradWrite::kAccumulate;
  float* const shard_grad = shards_->grad(unit).data();
  double* const squares = squares_of(unit);
  const int world = coll_.shard().world_size();
  if (NcclCommunicator* exchange = coll_.exchange()) {
    // Each rank's slice q goes to rank q on the copy engines; this rank adds the slices it received in rank order
    // as it takes them into its shard (the addition NCCL's reduce-scatter kernel would have made on the SMs).
    exchange->all_to_all<T>(b->data.data(), h.slot, rs_out_.data(), ns);
    if (fresh_grads_) optimizer_.wait_updated(unit, ns);
    gpu::accumulate_parts<T>(shard_grad, rs_out_.data(), world, h.slot, h.span.count, comm_ctx_, write, squares);
  } else {
    // At one rank the full gradient is the shard's: it is added as it lies, without the reduce-scatter's copy.
    const T* part = b->data.data();
    if (world > 1) {
      coll_.reduce_scatter_comm(unit).reduce_scatter<T>(b->data.data(), h.slot, rs_out_.data(), ns);
      part = rs_out_.data();
    }
    // The step's first write of the shard replaces the last step's gradient, which that step's AdamW read.
    if (fresh_grads_) optimizer_.wait_updated(unit, ns);
    gpu::accumulate<T>(shard_grad, part, h.span.count, comm_ctx_, write, squares);
  }
  if (last_micro_) finish_grad(unit, squares != nullptr);  // overlaps the rest of the backward
  buffers_->release_grads(unit, ns);
  ++counters_.reduce_scatters[static_cast<size_t>(unit)];
  counters_.reduce_scattered_elements += h.slot * world;
  counters_.cross_node_bytes += groups_.shard_cross_bytes(h.slot, sizeof(T));
}

template <typename T>
double* CudaShardedModel<T>::squares_of(int unit) {
  if (!last_micro_ || replica_) return nullptr;
  return optimizer_.norm_part(unit, comm_stream_.get());
}

template <typename T>
void CudaShardedModel<T>::finish_grad(int unit, bool norm_taken) {
  std::vector<int> finished{unit};
  if (replica_) {
    finished = replica_->add(unit, *shards_, comm_stream_.get(), groups_, counters_);
    summed_across_nodes_ = replica_->idle();  // the step's last unit went out
  }
  // The norm's share of each finished shard, here rather than after the backward, where it would hold up the
  // optimizer: on the stream that finished it (each has reduction scratch of its own), unless the accumulation took it.
  const gpu::GpuContext& final_ctx = replica_ ? replica_->ctx() : comm_ctx_;
  for (int u : finished) {
    if (!norm_taken)
      gpu::sum_of_squares<float>(shards_->grad(u).data(), shards_->view(u).span.count,
                                 optimizer_.norm_part(u, final_ctx.stream), final_ctx);
    optimizer_.part_done();
  }
  for (int u : finished)
    if (offload(u)) offload_->grad_final(u, shards_->grad(u), final_grad_stream());
}

template <typename T>
void CudaShardedModel<T>::release_params(int unit) {
  buffers_->release_params(unit, compute_stream_.get());
}

// Every schedule starts with "gather 0", the largest unit (the tied embedding), and nothing can compute
// before it arrives. So as soon as the optimizer has updated unit 0's shard, its all-gather for the next run
// goes out on the communication stream, to overlap the optimizer steps of the other units instead of
// starting the next step. Every rank steps the same units in the same order, so the collectives still match.
template <typename T>
void CudaShardedModel<T>::prefetch_embedding() {
  issue_gather(0);  // after unit 0's update (updated_, or with offload its upload)
  embedding_prefetched_ = true;
}

template <typename T>
double CudaShardedModel<T>::run(const std::vector<ScheduleOp>& schedule, Mode mode, const int32_t* targets,
                                float dloss) {
  cudaStream_t cs = compute_stream_.get(), ns = comm_stream_.get();
  // Nothing the communication stream issues from here overtakes what the compute stream has queued before (a unit's
  // gather waits for its optimizer update by itself: issue_gather).
  compute_mark_.record(cs);
  compute_mark_.wait_on(ns);
  // The op profile is the training steps' (and their optimizer's, which follows a training run): evaluation and
  // sampling record nothing in it.
  model_->timer().pause(mode != Mode::kTrain);
  next_gather_ = 0;
  if (embedding_prefetched_) {
    ST_CHECK(!schedule.empty() && schedule[0] == (ScheduleOp{OpKind::kGather, 0}),
             "a schedule that does not start by gathering unit 0 after the optimizer prefetched it");
    next_gather_ = 1;
    embedding_prefetched_ = false;
  }
  mode_ = mode;
  targets_ = targets;
  dloss_ = dloss;
  run_schedule(schedule, *this);
  ST_CHECK(buffers_->in_use_bytes() == 0, "the schedule left ", buffers_->in_use_bytes(), " bytes of buffers in use");
  // The optimizer and the next step's zeroing must see every accumulated gradient (and, in hybrid, its sum across
  // nodes, which the last micro-step issued).
  comm_mark_.record(ns);
  wait_for_comm(comm_mark_, "comm_wait.step_end");
  if (replica_ && mode == Mode::kTrain && last_micro_) {
    replica_mark_.record(replica_->stream());
    wait_for_comm(replica_mark_, "comm_wait.across_nodes");
  }
  if (loss_queued_) {  // micro_step_queued: the loss stays on the device; finish_gated_step() reads it
    model_->move_loss_sum(optimizer_.loss_slot());
    return 0.0;
  }
  double loss_sum = 0.0;
  if (mode == Mode::kLogits)
    compute_stream_.synchronize();
  else
    loss_sum = model_->take_loss_sum();  // synchronises
  after_sync();
  return loss_sum;
}

template <typename T>
void CudaShardedModel<T>::gather(int unit, size_t at) {
  if (at < next_gather_) return;  // prefetch() issued it
  issue_gather(unit);
  next_gather_ = at + 1;
}

template <typename T>
void CudaShardedModel<T>::head(int unit) {
  if (mode_ == Mode::kLogits) {
    model_->head_logits(gathered(unit), gathered(0), len_ - 1, logits_out_);
  } else if (mode_ == Mode::kEval) {
    model_->head_forward(gathered(unit), gathered(0), targets_);
  } else {
    T* head_grad = full_grad(unit);
    T* emb_grad = full_grad(0);
    model_->head_forward_backward(gathered(unit), gathered(0), targets_, dloss_, head_grad, emb_grad);
  }
}

// The compute stream waits for `done`, timed (take_exposed_comm_ms), with a row in the op profile.
template <typename T>
void CudaShardedModel<T>::wait_for_comm(const CudaEvent& done, const char* what) {
  OpTimer::Laps lap = model_->timer().laps(compute_stream_.get());
  lap(what);
  stalls_.wait(compute_stream_.get(), done);
}

template <typename T>
void CudaShardedModel<T>::micro_step_queued(const int32_t* inputs, const int32_t* targets, float dloss) {
  ST_CHECK(gates_on_device() && !loss_queued_ && !gate_queued_, "micro_step_queued: ",
           gates_on_device() ? "the last queued step was not finished (finish_gated_step)" : "optimizer offload is on");
  ST_CHECK(micro_steps_left_ <= 1, "micro_step_queued for a micro-step that is not the step's last (",
           micro_steps_left_, " left)");
  loss_queued_ = true;
  try {
    micro_step(inputs, targets, dloss);
  } catch (...) {
    loss_queued_ = false;
    throw;
  }
}

template <typename T>
double CudaShardedModel<T>::micro_step(const int32_t* inputs, const int32_t* targets, float dloss) {
  ST_CHECK(!summed_across_nodes_,
           "micro_step after this step's gradients were summed across nodes: call zero_grads() "
           "and expect_micro_steps() first");
  last_micro_ = --micro_steps_left_ <= 0;
  tokens_ = inputs;
  batch_ = cfg_.train.micro_batch;
  len_ = cfg_.model.seq_len;
  model_->set_dropout_batch(cfg_.train.seed, first_sequence_);
  record_fp8_maxima(true);
  first_sequence_ = -1;
  const double loss_sum =
      run(training_schedule(cfg_.model.n_layer, cfg_.dist.reshard_after_forward, /*keep_embedding=*/true), Mode::kTrain,
          targets, dloss);
  fresh_grads_ = false;  // the next micro-step of this step adds to the shards
  // Every buffer of ours is allocated at set-up, but NCCL connects its peers (and allocates their buffers) at
  // the first collectives, and the libraries may allocate on first use: sample after each micro-step.
  sample_device_memory();
  return loss_sum;
}

template <typename T>
double CudaShardedModel<T>::eval_micro(const int32_t* inputs, const int32_t* targets) {
  model_->set_dropout_batch(cfg_.train.seed, -1);
  record_fp8_maxima(false);
  tokens_ = inputs;
  batch_ = cfg_.train.micro_batch;
  len_ = cfg_.model.seq_len;
  return run(eval_schedule(cfg_.model.n_layer, /*keep_embedding=*/true), Mode::kEval, targets, 0.0f);
}

template <typename T>
void CudaShardedModel<T>::last_logits(const int32_t* tokens, int64_t len, std::vector<float>* logits) {
  model_->set_dropout_batch(cfg_.train.seed, -1);
  record_fp8_maxima(false);
  tokens_ = tokens;
  batch_ = 1;
  len_ = len;
  logits_out_ = logits;
  run(eval_schedule(cfg_.model.n_layer, /*keep_embedding=*/true), Mode::kLogits, nullptr, 0.0f);
  logits_out_ = nullptr;
}

// The members defined here, for each compute type (the class itself is instantiated in cuda_sharded_model.cu).
#define ST_INSTANTIATE_SCHEDULE(T)                                                                                    \
  template void CudaShardedModel<T>::zero_grads();                                                                    \
  template void CudaShardedModel<T>::issue_gather(int);                                                               \
  template void CudaShardedModel<T>::prefetch(const std::vector<ScheduleOp>&, size_t);                                \
  template const T* CudaShardedModel<T>::gathered(int);                                                               \
  template T* CudaShardedModel<T>::full_grad(int);                                                                    \
  template void CudaShardedModel<T>::reduce_scatter(int);                                                             \
  template double* CudaShardedModel<T>::squares_of(int);                                                              \
  template void CudaShardedModel<T>::finish_grad(int, bool);                                                          \
  template void CudaShardedModel<T>::release_params(int);                                                             \
  template void CudaShardedModel<T>::prefetch_embedding();                                                            \
  template double CudaShardedModel<T>::run(const std::vector<ScheduleOp>&, CudaShardedModel<T>::Mode, const int32_t*, \
                                           float);                                                                    \
  template void CudaShardedModel<T>::gather(int, size_t);                                                             \
  template void CudaShardedModel<T>::head(int);                                                                       \
  template void CudaShardedModel<T>::wait_for_comm(const CudaEvent&, const char*);                                    \
  template void CudaShardedModel<T>::micro_step_queued(const int32_t*, const int32_t*, float);                        \
  template double CudaShardedModel<T>::micro_step(const int32_t*, const int32_t*, float);                             \
  template double CudaShardedModel<T>::eval_micro(const int32_t*, const int32_t*);                                    \
  template void CudaShardedModel<T>::last_logits(const int32_t*, int64_t, std::vector<float>*);
ST_INSTANTIATE_SCHEDULE(float)
ST_INSTANTIATE_SCHEDULE(bf16)
ST_INSTANTIATE_SCHEDULE(fp16)
#undef ST_INSTANTIATE_SCHEDULE

}  // namespace st::shard_internal
