#include "shardtrain/train/step_engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "shardtrain/core/error.h"
#include "shardtrain/core/fault.h"
#include "shardtrain/model/decoder.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/optim/adamw_optimizer.h"
#include "shardtrain/optim/lr_schedule.h"

namespace st {

StepEngine::StepEngine(const Config& cfg, Communicator& comm) : StepEngine(cfg, comm, make_model_backend(cfg, comm)) {}

StepEngine::StepEngine(const Config& cfg, Communicator& comm, std::unique_ptr<ModelBackend> model)
    : cfg_(cfg), comm_(comm), model_(std::move(model)), scaler_(LossScaler::for_dtype(cfg.compute_dtype())) {
  ST_CHECK(model_ != nullptr, "StepEngine over no backend");
  const int64_t BT = cfg.train.micro_batch * cfg.model.seq_len;
  inputs_.resize(BT);
  targets_.resize(BT);
  // Fixed for the run. Asked once: with optimizer offload, shard() waits for the host AdamW, which the optimizer
  // loop must not do between its units.
  for (const UnitLayout& u : units()) spans_.push_back(model_->shard(u.index).span);
}

int64_t StepEngine::step_targets(int64_t accum, int64_t targets) const {
  ST_CHECK(accum >= 1, "a step of ", accum, " micro-steps");
  const int64_t positions = cfg_.train.micro_batch * cfg_.model.seq_len * accum * comm_.world_size();
  if (targets == kEveryPosition) return positions;
  ST_CHECK(targets >= 0 && targets <= positions, "a step of ", targets, " targets in ", positions, " positions");
  return targets;
}

float StepEngine::begin_step(int64_t accum, int64_t step, int64_t targets) {
  ST_CHECK(step >= 0 || !cfg_.model.lora.enabled() || cfg_.model.lora.dropout == 0,
           "a training step with adapter dropout needs its step number: the dropout masks are keyed by it");
  step_ = step;
  accum_ = accum;
  model_->zero_grads();
  model_->expect_micro_steps(accum);
  if (model_->speculates()) {
    // The update this step takes unless it is clipped or skipped, so that the host AdamW can start during the
    // backward: optimizer_step builds its runs the same way, so an unclipped step's are equal bit for bit. None
    // after a clipped or skipped step (speculate_next_), or for a step without a number (whose update is unknown).
    model_->speculate_optimizer(step >= 0 && speculate_next_ ? unit_runs(next_update(step, 1.0f, scaler_.scale()))
                                                             : std::vector<std::vector<AdamWRun>>{});
  }
  // The mean over the step's targets: each one's loss gradient is 1 / targets (times the fp16 loss scale).
  float dloss = static_cast<float>(scaler_.scale() / static_cast<double>(targets));
  // The seam for "one rank's gradients overflowed": an infinite loss gradient makes every gradient of
  // this rank non-finite, as an fp16 overflow would (steps are 1-based in SHARDTRAIN_FAULT).
  if (step >= 0 && fault_injected("grad_inf", comm_.rank(), step + 1)) dloss = std::numeric_limits<float>::infinity();
  return dloss;
}

int64_t StepEngine::fill(const BatchFn& batch, int64_t micro) {
  batch(micro, inputs_.data(), targets_.data());
  // The micro-batch's first global sequence in the sampler's order (data/sampler.h), which keys adapter dropout;
  // evaluation runs without it whatever is set here.
  const int64_t B = cfg_.train.micro_batch;
  model_->set_dropout_batch(step_ < 0 ? -1 : ((step_ * accum_ + micro) * comm_.world_size() + comm_.rank()) * B);
  return static_cast<int64_t>(std::count_if(targets_.begin(), targets_.end(), [](int32_t t) { return t >= 0; }));
}

float StepEngine::mean_loss(double loss_sum, int64_t local_targets, int64_t targets) {
  // One all-reduce, as without masks: the loss sums and, beside them, the counts that check the normaliser.
  double sums[2] = {loss_sum, static_cast<double>(local_targets)};
  comm_.all_reduce(sums, 2);
  ST_CHECK(std::llround(sums[1]) == targets, "the step's batches hold ", std::llround(sums[1]),
           " targets over every rank, but its loss was normalised by ", targets,
           " (the caller's count: Sampler::step_targets, or every position)");
  return static_cast<float>(sums[0] / static_cast<double>(targets));
}

StepStats StepEngine::no_target_step(int64_t step) {
  StepStats s;
  s.loss = std::numeric_limits<float>::quiet_NaN();
  s.lr = lr_at(cfg_.optim, step, cfg_.train.steps);
  s.loss_scale = scaler_.scale();
  s.skipped = s.no_targets = true;
  return s;
}

float StepEngine::forward_backward(const BatchFn& batch, int64_t accum, int64_t step, int64_t targets) {
  const int64_t n = step_targets(accum, targets);
  no_targets_ = n == 0;
  if (no_targets_) {
    model_->zero_grads();
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float dloss = begin_step(accum, step, n);
  double loss_sum = 0.0;
  int64_t local = 0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    local += fill(batch, micro);
    loss_sum += model_->micro_step(inputs_.data(), targets_.data(), dloss);
  }
  return mean_loss(loss_sum, local, n);
}

StepStats StepEngine::train_step(const BatchFn& batch, int64_t accum, int64_t step, int64_t targets) {
  if (!model_->gates_on_device()) return optimizer_step(step, forward_backward(batch, accum, step, targets));
  const int64_t n = step_targets(accum, targets);
  if (n == 0) {
    model_->zero_grads();
    return no_target_step(step);
  }
  const float dloss = begin_step(accum, step, n);
  double loss_sum = 0.0;
  int64_t local = 0;
  for (int64_t micro = 0; micro + 1 < accum; ++micro) {
    local += fill(batch, micro);
    loss_sum += model_->micro_step(inputs_.data(), targets_.data(), dloss);
  }
  local += fill(batch, accum - 1);
  model_->micro_step_queued(inputs_.data(), targets_.data(), dloss);
  StepStats s;
  s.lr = lr_at(cfg_.optim, step, cfg_.train.steps);
  s.loss_scale = scaler_.scale();
  // The runs an unclipped update takes; the device's decision replaces their gradient scale (clip / loss scale).
  model_->queue_gated_update(loss_sum, s.loss_scale, cfg_.optim.grad_clip,
                             unit_runs(next_update(step, 1.0f, s.loss_scale)));
  const ModelBackend::GatedStep g = model_->finish_gated_step();
  s.loss = mean_loss(loss_sum + g.last_loss_sum, local, n);
  s.grad_norm = g.gate.grad_norm;
  return end_step(s, g.gate.skip == 0);
}

StepStats StepEngine::end_step(StepStats s, bool finite) {
  scaler_.update(finite);
  model_->fp8_step_end(finite);
  speculate_next_ = finite && clip_coefficient(cfg_.optim, s.grad_norm) == 1.0f;
  if (!finite) {
    model_->drop_speculation();
    s.skipped = true;
    return s;
  }
  ++updates_;
  return s;
}

StepStats StepEngine::optimizer_step(int64_t step, float loss) {
  if (no_targets_) {
    no_targets_ = false;
    return no_target_step(step);
  }
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
  double sums[2] = {0.0, 0.0};  // the loss sum and the number of targets, over every rank after the all-reduce
  for (int64_t i = 0; i < batches; ++i) {
    sums[1] += static_cast<double>(fill(batch, i));
    sums[0] += model_->eval_micro(inputs_.data(), targets_.data());
  }
  comm_.all_reduce(sums, 2);
  if (sums[1] == 0.0) {
    ST_BAD_INPUT("evaluation over ", batches, " batch(es) of ", cfg_.train.micro_batch, " x ", cfg_.model.seq_len,
                 " tokens on each of ", comm_.world_size(),
                 " rank(s) found no target: every one is masked by the data's loss masks");
  }
  return static_cast<float>(sums[0] / sums[1]);
}

std::vector<int32_t> StepEngine::generate(const std::vector<int32_t>& prompt, int64_t n, const SamplingOptions& options,
                                          GenerationStats* stats) {
  // A LoRA model decodes as its base with the adapters merged in.
  Config merged = cfg_;
  merged.model = base_model(cfg_.model);
  const std::unique_ptr<Decoder> decoder = make_unloaded_decoder(merged, comm_.device_rank());
  const std::vector<UnitLayout> base_units = build_units(merged.model);
  for (const UnitLayout& u : units()) {
    std::vector<float> w = gather_unit(u.index);
    if (cfg_.model.lora.enabled()) w = merge_lora_unit(cfg_.model, u, base_units[static_cast<size_t>(u.index)], w);
    decoder->load_unit(u.index, w);
  }
  return generate_tokens(*decoder, prompt, n, options, stats);
}

std::vector<float> StepEngine::gather_unit(int unit) {
  std::vector<float> out = model_->gather_params(unit);
  std::vector<float> frozen = model_->gather_frozen(unit);
  if (out.empty()) return frozen;  // wholly frozen (a LoRA base's embedding): no second copy of it
  out.insert(out.end(), frozen.begin(), frozen.end());
  return out;
}

std::vector<std::vector<float>> StepEngine::gather_params() {
  std::vector<std::vector<float>> out;
  for (const UnitLayout& u : units()) out.push_back(gather_unit(u.index));
  return out;
}

std::vector<std::vector<float>> StepEngine::gather_grads() {
  std::vector<std::vector<float>> out;
  for (const UnitLayout& u : units()) out.push_back(model_->gather_grads(u.index));
  return out;
}

}  // namespace st
