#include "shardtrain/train/step_engine.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "shardtrain/core/error.h"
#include "shardtrain/core/fault.h"
#include "shardtrain/model/decoder.h"
#include "shardtrain/optim/adamw_optimizer.h"
#include "shardtrain/optim/lr_schedule.h"

namespace st {

StepEngine::StepEngine(const Config& cfg, Communicator& comm)
    : cfg_(cfg), comm_(comm), model_(make_model_backend(cfg, comm)), scaler_(LossScaler::for_dtype(cfg.compute_dtype())) {
  const int64_t BT = cfg.train.micro_batch * cfg.model.seq_len;
  inputs_.resize(BT);
  targets_.resize(BT);
  // Fixed for the run. Asked once: with optimizer offload, shard() waits for the host AdamW, which the optimizer
  // loop must not do between its units.
  for (const UnitLayout& u : units()) spans_.push_back(model_->shard(u.index).span);
}

float StepEngine::begin_step(int64_t accum, int64_t step) {
  ST_CHECK(accum >= 1, "a step of ", accum, " micro-steps");
  model_->zero_grads();
  model_->expect_micro_steps(accum);
  if (model_->speculates() && step >= 0) {
    // The update this step takes unless it is clipped or skipped, so that the host AdamW can start during the
    // backward: optimizer_step builds its runs the same way, so an unclipped step's are equal bit for bit.
    model_->speculate_optimizer(unit_runs(next_update(step, 1.0f, scaler_.scale())));
  }
  const int64_t tokens = cfg_.train.micro_batch * cfg_.model.seq_len * accum * comm_.world_size();
  float dloss = static_cast<float>(scaler_.scale() / static_cast<double>(tokens));
  // The seam for "one rank's gradients overflowed": an infinite loss gradient makes every gradient of
  // this rank non-finite, as an fp16 overflow would (steps are 1-based in SHARDTRAIN_FAULT).
  if (step >= 0 && fault_injected("grad_inf", comm_.rank(), step + 1)) dloss = std::numeric_limits<float>::infinity();
  return dloss;
}

float StepEngine::mean_loss(double loss_sum, int64_t accum) {
  comm_.all_reduce(&loss_sum, 1);
  return static_cast<float>(loss_sum / static_cast<double>(accum * comm_.world_size()));
}

float StepEngine::forward_backward(const BatchFn& batch, int64_t accum, int64_t step) {
  const float dloss = begin_step(accum, step);
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    batch(micro, inputs_.data(), targets_.data());
    loss_sum += model_->micro_step(inputs_.data(), targets_.data(), dloss);
  }
  return mean_loss(loss_sum, accum);
}

StepStats StepEngine::train_step(const BatchFn& batch, int64_t accum, int64_t step) {
  if (!model_->gates_on_device()) return optimizer_step(step, forward_backward(batch, accum, step));
  const float dloss = begin_step(accum, step);
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro + 1 < accum; ++micro) {
    batch(micro, inputs_.data(), targets_.data());
    loss_sum += model_->micro_step(inputs_.data(), targets_.data(), dloss);
  }
  batch(accum - 1, inputs_.data(), targets_.data());
  model_->micro_step_queued(inputs_.data(), targets_.data(), dloss);
  StepStats s;
  s.lr = lr_at(cfg_.optim, step, cfg_.train.steps);
  s.loss_scale = scaler_.scale();
  // The runs an unclipped update takes; the device's decision replaces their gradient scale (clip / loss scale).
  model_->queue_gated_update(loss_sum, s.loss_scale, cfg_.optim.grad_clip,
                             unit_runs(next_update(step, 1.0f, s.loss_scale)));
  const ModelBackend::GatedStep g = model_->finish_gated_step();
  s.loss = mean_loss(loss_sum + g.last_loss, accum);
  s.grad_norm = g.gate.grad_norm;
  return end_step(s, g.gate.skip == 0);
}

StepStats StepEngine::end_step(StepStats s, bool finite) {
  scaler_.update(finite);
  if (!finite) {
    model_->drop_speculation();
    s.skipped = true;
    return s;
  }
  ++updates_;
  return s;
}

StepStats StepEngine::optimizer_step(int64_t step, float loss) {
  StepStats s;
  s.loss = loss;
  s.lr = lr_at(cfg_.optim, step, cfg_.train.steps);
  s.loss_scale = scaler_.scale();
  double sq = model_->grad_sum_of_squares();
  model_->shard_comm().all_reduce(&sq, 1);  // each element once: hybrid's replicas hold the same shards
  // loss and norm are the same number on every rank, so every rank takes the same decision (the one the device
  // takes in train_step).
  const StepGate gate = decide_step(sq, loss, s.loss_scale, cfg_.optim.grad_clip);
  s.grad_norm = gate.grad_norm;
  if (gate.skip != 0) return end_step(s, false);
  const std::vector<std::vector<AdamWRun>> runs =
      unit_runs(next_update(step, clip_coefficient(cfg_.optim, s.grad_norm), s.loss_scale));
  s = end_step(s, true);
  for (const UnitLayout& u : units()) model_->adamw(u.index, runs[static_cast<size_t>(u.index)]);
  return s;
}

OptimizerStep StepEngine::next_update(int64_t step, float clip, double loss_scale) const {
  OptimizerStep os;
  os.lr = lr_at(cfg_.optim, step, cfg_.train.steps);
  os.t = updates_ + 1;
  os.grad_scale = static_cast<float>(clip / loss_scale);
  return os;
}

std::vector<std::vector<AdamWRun>> StepEngine::unit_runs(const OptimizerStep& step) {
  std::vector<std::vector<AdamWRun>> runs(units().size());
  for (const UnitLayout& u : units()) {
    const ShardSpan& span = spans_[static_cast<size_t>(u.index)];
    runs[static_cast<size_t>(u.index)] = adamw_runs(u, span.offset, span.end(), cfg_.optim, step);
  }
  return runs;
}

float StepEngine::evaluate(const BatchFn& batch, int64_t batches) {
  double sum = 0.0;
  for (int64_t i = 0; i < batches; ++i) {
    batch(i, inputs_.data(), targets_.data());
    sum += model_->eval_micro(inputs_.data(), targets_.data());
  }
  comm_.all_reduce(&sum, 1);
  return static_cast<float>(sum / static_cast<double>(batches * comm_.world_size()));
}

std::vector<int32_t> StepEngine::generate(const std::vector<int32_t>& prompt, int64_t n, const SamplingOptions& options,
                                          GenerationStats* stats) {
  const std::unique_ptr<Decoder> decoder = make_decoder(cfg_, gather_params(), comm_.device_rank());
  return generate_tokens(*decoder, prompt, n, options, stats);
}

std::vector<std::vector<float>> StepEngine::gather_params() {
  std::vector<std::vector<float>> out;
  for (const UnitLayout& u : units()) out.push_back(model_->gather_params(u.index));
  return out;
}

std::vector<std::vector<float>> StepEngine::gather_grads() {
  std::vector<std::vector<float>> out;
  for (const UnitLayout& u : units()) out.push_back(model_->gather_grads(u.index));
  return out;
}

}  // namespace st
