// One optimizer step of ZeRO-3 training on this rank: the micro-steps of the sharded model, the global
// loss and gradient norm, clipping, the non-finite skip (agreed by all ranks, since both numbers are
// all-reduced), and AdamW on this rank's owned spans only. With a SoloCommunicator it is the
// single-process fp32 reference; with N ranks it computes the same step to rounding.
//
//   StepEngine e(cfg, comm);
//   StepStats s = e.train_step(batch_fn, accum, step);   // both of the next two, in one
//   float loss = e.forward_backward(batch_fn, accum);   // grads hold the step's mean gradient, sharded
//   StepStats s = e.optimizer_step(step, loss);          // norm, clip, skip-if-non-finite, AdamW
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/model/generation.h"
#include "shardtrain/model/sampling.h"
#include "shardtrain/optim/adamw_optimizer.h"
#include "shardtrain/optim/loss_scaler.h"
#include "shardtrain/shard/model_backend.h"

namespace st {

// Fills this rank's micro-batch `micro_step` of the current step: inputs and targets, each
// [micro_batch, seq_len].
using BatchFn = std::function<void(int64_t micro_step, int32_t* inputs, int32_t* targets)>;

struct StepStats {
  float loss = 0;        // mean over all ranks' tokens
  double grad_norm = 0;  // global, before clipping
  float lr = 0;
  bool skipped = false;  // non-finite loss or norm: no update was applied (on every rank)
  double loss_scale = 1;  // the fp16 loss scale this step's gradients were computed with (1 otherwise)
};

class StepEngine {
 public:
  StepEngine(const Config& cfg, Communicator& comm);

  // Zeroes the gradient shards, runs `accum` micro-steps, and returns the mean loss over every rank's
  // accum * micro_batch * seq_len tokens. The gradient shards then hold the gradient of that mean, times
  // the loss scale in fp16. `step` (0-based) only keys the grad_inf fault seam (core/fault.h).
  float forward_backward(const BatchFn& batch, int64_t accum, int64_t step = -1);

  // Global gradient norm (local sums of squares over owned spans, all-reduced, divided by the loss
  // scale), clipping, a skip on a non-finite loss or norm, and AdamW with the scheduled lr of 0-based
  // `step` on owned spans. The update count used for bias correction advances only on applied steps; in
  // fp16 the loss scale backs off on a skip and grows after a run of finite steps.
  StepStats optimizer_step(int64_t step, float loss);

  // forward_backward then optimizer_step, with the same results. On a backend that gates_on_device() the host does
  // not wait between the backward and the optimizer: the norm, the clip and the skip are decided on the device and
  // AdamW is queued before the host reads the loss and the norm back (the only wait of the step).
  StepStats train_step(const BatchFn& batch, int64_t accum, int64_t step);

  // Mean loss over `batches` micro-batches per rank, over all ranks. Collective.
  float evaluate(const BatchFn& batch, int64_t batches);

  // Samples `n` tokens continuing `prompt` with a key/value-cache decoder on train.device (model/decoder.h) over the
  // gathered weights, by generate_tokens (model/generation.h: the sampling rule, the sliding context), identically
  // on every rank. Collective (the gather).
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t n, const SamplingOptions& options,
                                GenerationStats* stats = nullptr);

  // Full flat parameter (or gradient) buffers of every unit, on every rank. Collective.
  std::vector<std::vector<float>> gather_params();
  std::vector<std::vector<float>> gather_grads();

  ModelBackend& sharded() { return *model_; }
  const std::vector<UnitLayout>& units() const { return model_->units(); }
  int64_t updates() const { return updates_; }
  // Restores the AdamW update count from a checkpoint.
  void set_updates(int64_t t) { updates_ = t; }
  LossScaler& loss_scaler() { return scaler_; }

 private:
  // zero_grads, the micro-step count, the speculative update; returns the loss gradient a token (the fault seam's).
  float begin_step(int64_t accum, int64_t step);
  // The mean over every rank's tokens of the step whose micro-steps' mean losses on this rank sum to loss_sum.
  float mean_loss(double loss_sum, int64_t accum);
  // The loss scaler, and with an applied step the update count; a skipped one drops any speculative update.
  StepStats end_step(StepStats s, bool finite);
  // The next AdamW update at `step`: its lr, its count, and the gradient scale clip / loss_scale.
  OptimizerStep next_update(int64_t step, float clip, double loss_scale) const;
  // Every unit's AdamW runs (by unit index) for `step`.
  std::vector<std::vector<AdamWRun>> unit_runs(const OptimizerStep& step);

  Config cfg_;
  Communicator& comm_;
  std::unique_ptr<ModelBackend> model_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<ShardSpan> spans_;  // each unit's owned span on this rank, by unit index
  int64_t updates_ = 0;
  LossScaler scaler_;
};

}  // namespace st
