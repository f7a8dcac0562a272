// One optimizer step of ZeRO-3 training on this rank: the micro-steps of the sharded model, the global
// loss and gradient norm, clipping, the non-finite skip (agreed by all ranks, since both numbers are
// all-reduced), and AdamW on this rank's owned spans only. With a SoloCommunicator it is the
// single-process fp32 reference; with N ranks it computes the same step to rounding.
//
// THE LOSS is PyTorch's F.cross_entropy(logits, targets, ignore_index=...) with reduction mean over the whole
// global batch (every micro-step of every rank): the sum of the per-token losses over the targets, divided by the
// number of targets, n. A target < 0 is not a target (a masked position, data/sampler.h): it adds no loss, no
// gradient, and does not count in n. Each token's loss gradient is loss_scale / n. The caller gives n (`targets`,
// from Sampler::step_targets(), which every rank computes alike from the mask bytes of every rank's windows), so the
// normaliser costs no collective; the step's existing loss all-reduce carries this rank's count too, and a total
// that differs from n is an internal error. kEveryPosition: every position is a target (data without a loss mask).
//
// A step with no target at all (n == 0, every target of the global batch masked) computes nothing: no forward, no
// backward, the gradient is zero and no update is applied (the AdamW update count and the fp16 loss scale are left
// as they were); its StepStats say skipped and no_targets, and its loss is NaN (0/0, as PyTorch's mean over no
// target). Every rank takes the same decision, since n is the same number on every rank.
//
//   StepEngine e(cfg, comm);
//   StepStats s = e.train_step(batch_fn, accum, step, n);   // both of the next two, in one
//   float loss = e.forward_backward(batch_fn, accum, step, n);   // grads hold the step's mean gradient, sharded
//   StepStats s = e.optimizer_step(step, loss);                  // norm, clip, skip-if-non-finite, AdamW
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
// [micro_batch, seq_len]; a target < 0 is not a target.
using BatchFn = std::function<void(int64_t micro_step, int32_t* inputs, int32_t* targets)>;

// The `targets` of a step or evaluation in which every position is a target.
inline constexpr int64_t kEveryPosition = -1;

struct StepStats {
  float loss = 0;        // mean over all ranks' targets (NaN when the step has none)
  double grad_norm = 0;  // global, before clipping
  float lr = 0;
  bool skipped = false;     // no update was applied (on every rank): a non-finite loss or norm, or no target
  bool no_targets = false;  // the step's global batch holds no target: nothing was computed (skipped too)
  double loss_scale = 1;    // the fp16 loss scale this step's gradients were computed with (1 otherwise)
};

class StepEngine {
 public:
  StepEngine(const Config& cfg, Communicator& comm);
  // Over a given backend (make_model_backend's for cfg, or one that wraps it).
  StepEngine(const Config& cfg, Communicator& comm, std::unique_ptr<ModelBackend> model);

  // Zeroes the gradient shards, runs `accum` micro-steps, and returns the mean loss over the `targets` targets of
  // every rank's accum * micro_batch * seq_len positions (kEveryPosition: all of them). The gradient shards then
  // hold the gradient of that mean, times the loss scale in fp16. `step` (0-based) only keys the grad_inf fault seam
  // (core/fault.h). With targets == 0 it runs nothing and returns NaN (see the file comment).
  float forward_backward(const BatchFn& batch, int64_t accum, int64_t step = -1, int64_t targets = kEveryPosition);

  // Global gradient norm (local sums of squares over owned spans, all-reduced, divided by the loss
  // scale), clipping, a skip on a non-finite loss or norm, and AdamW with the scheduled lr of 0-based
  // `step` on owned spans. The update count used for bias correction advances only on applied steps; in
  // fp16 the loss scale backs off on a skip and grows after a run of finite steps. After a forward_backward with no
  // target it applies nothing and returns skipped and no_targets.
  StepStats optimizer_step(int64_t step, float loss);

  // forward_backward then optimizer_step, with the same results. On a backend that gates_on_device() the host does
  // not wait between the backward and the optimizer: the norm, the clip and the skip are decided on the device and
  // AdamW is queued before the host reads the loss and the norm back (the only wait of the step).
  StepStats train_step(const BatchFn& batch, int64_t accum, int64_t step, int64_t targets = kEveryPosition);

  // Mean loss over the targets of `batches` micro-batches per rank, over all ranks (the same masked mean as a
  // step's). Collective. Batches that hold no target at all are kBadInput on every rank.
  float evaluate(const BatchFn& batch, int64_t batches);

  // Samples `n` tokens continuing `prompt` with a key/value-cache decoder on train.device (model/decoder.h) over the
  // gathered weights, by generate_tokens (model/generation.h: the sampling rule, the sliding context), identically
  // on every rank. Collective (the gather). The units are gathered into the decoder one at a time (a LoRA model's
  // merged as they come), so that the host holds one unit's buffers beside the decoder's own.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t n, const SamplingOptions& options,
                                GenerationStats* stats = nullptr);

  // Full flat parameter buffers of every unit, every tensor at its offset (units.h: the trainable tensors, then the
  // frozen ones), on every rank; and the gradient buffers (the trainable tensors). Collective.
  std::vector<std::vector<float>> gather_params();
  // gather_params' buffer of one unit. Collective.
  std::vector<float> gather_unit(int unit);
  std::vector<std::vector<float>> gather_grads();

  ModelBackend& sharded() { return *model_; }
  const std::vector<UnitLayout>& units() const { return model_->units(); }
  int64_t updates() const { return updates_; }
  // Restores the AdamW update count from a checkpoint.
  void set_updates(int64_t t) { updates_ = t; }
  LossScaler& loss_scaler() { return scaler_; }

 private:
  // The step's number of targets: `targets`, or every position for kEveryPosition.
  int64_t step_targets(int64_t accum, int64_t targets) const;
  int64_t step_ = -1, accum_ = 1;  // the running step (begin_step), for the dropout keys of its micro-batches
  // zero_grads, the micro-step count, the speculative update; returns the loss gradient a token (the fault seam's)
  // for a step of `targets` (> 0) targets.
  float begin_step(int64_t accum, int64_t step, int64_t targets);
  // Fills micro-step `micro`'s batch into inputs_ and targets_; returns this rank's targets in it.
  int64_t fill(const BatchFn& batch, int64_t micro);
  // The mean over every rank's targets of the step whose loss sums on this rank add up to loss_sum over
  // local_targets targets; the step has `targets` targets in all (checked against the all-reduced count).
  float mean_loss(double loss_sum, int64_t local_targets, int64_t targets);
  // The stats of a step with no target (nothing computed, nothing applied; the caller zeroed the gradients).
  StepStats no_target_step(int64_t step);
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
  bool no_targets_ = false;  // the last forward_backward had no target: optimizer_step applies nothing
  // Whether the next step hands the backend its speculative update (ModelBackend::speculates): after a step whose
  // update was clipped or skipped, the next one's most likely is too, and every unit's speculative update would be
  // redone; a step speculates again after one that applied its update unclipped.
  bool speculate_next_ = true;
};

}  // namespace st
