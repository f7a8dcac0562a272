#include "shardtrain/train/local_step.h"

#include <algorithm>
#include <cmath>

#include "shardtrain/core/error.h"
#include "shardtrain/core/log.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/optim/adamw_optimizer.h"
#include "shardtrain/optim/lr_schedule.h"

namespace st {
namespace {

// RNG stream for text generation, apart from the initialisation streams (units.cc).
constexpr uint64_t kSampleStream = 0x5A3D1E;

void fill_zero(std::vector<std::vector<float>>& bufs) {
  for (auto& b : bufs) std::fill(b.begin(), b.end(), 0.0f);
}

}  // namespace

LocalStep::LocalStep(const Config& cfg) : cfg_(cfg), model_(cfg.model, cfg.train.micro_batch) {
  for (const UnitLayout& u : model_.units()) {
    params_.emplace_back(u.numel);
    grads_.emplace_back(u.numel, 0.0f);
    m_.emplace_back(u.numel, 0.0f);
    v_.emplace_back(u.numel, 0.0f);
    init_unit_range(u, cfg.model, cfg.train.seed, 0, u.numel, params_.back().data());
  }
  const int64_t BT = cfg.train.micro_batch * cfg.model.seq_len;
  inputs_.resize(BT);
  targets_.resize(BT);
}

void LocalStep::forward(const int32_t* inputs, int64_t B, int64_t T) {
  model_.embedding_forward(params_[0].data(), inputs, B, T);
  for (int l = 0; l < cfg_.model.n_layer; ++l) model_.block_forward(l, params_[1 + l].data());
}

float LocalStep::forward_backward(const BatchFn& batch, int64_t accum) {
  fill_zero(grads_);
  const int64_t B = cfg_.train.micro_batch, T = cfg_.model.seq_len;
  const int L = cfg_.model.n_layer;
  const float dloss = 1.0f / static_cast<float>(B * T * accum);
  double loss_sum = 0.0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    batch(micro, inputs_.data(), targets_.data());
    forward(inputs_.data(), B, T);
    loss_sum += model_.head_forward_backward(params_[L + 1].data(), params_[0].data(), targets_.data(), dloss,
                                             grads_[L + 1].data(), grads_[0].data());
    for (int l = L - 1; l >= 0; --l) model_.block_backward(l, params_[1 + l].data(), grads_[1 + l].data());
    model_.embedding_backward(grads_[0].data());
  }
  return static_cast<float>(loss_sum / static_cast<double>(accum));
}

StepStats LocalStep::optimizer_step(int64_t step, float loss) {
  StepStats s;
  s.loss = loss;
  s.lr = lr_at(cfg_.optim, step, cfg_.train.steps);
  double sq = 0.0;
  for (const auto& g : grads_) sq += sum_of_squares(g.data(), static_cast<int64_t>(g.size()));
  s.grad_norm = std::sqrt(sq);
  if (!std::isfinite(loss) || !std::isfinite(s.grad_norm)) {
    s.skipped = true;
    return s;
  }
  OptimizerStep os;
  os.lr = s.lr;
  os.t = ++updates_;
  os.grad_scale = clip_coefficient(cfg_.optim, s.grad_norm);
  for (const UnitLayout& u : model_.units()) {
    const size_t i = static_cast<size_t>(u.index);
    adamw_step_span(u, 0, u.numel, cfg_.optim, os, params_[i].data(), m_[i].data(), v_[i].data(), grads_[i].data());
  }
  return s;
}

float LocalStep::evaluate(const BatchFn& batch, int64_t batches) {
  const int64_t B = cfg_.train.micro_batch, T = cfg_.model.seq_len;
  const int L = cfg_.model.n_layer;
  double sum = 0.0;
  for (int64_t i = 0; i < batches; ++i) {
    batch(i, inputs_.data(), targets_.data());
    forward(inputs_.data(), B, T);
    sum += model_.head_forward(params_[L + 1].data(), params_[0].data(), targets_.data());
  }
  return static_cast<float>(sum / static_cast<double>(batches));
}

std::vector<int32_t> LocalStep::generate(const std::vector<int32_t>& prompt, int64_t n, uint64_t seed) {
  ST_CHECK(!prompt.empty(), "generation needs a prompt of at least one token");
  const int L = cfg_.model.n_layer;
  const int64_t T = cfg_.model.seq_len;
  std::vector<int32_t> seq = prompt, out;
  std::vector<float> logits;
  Rng rng(seed, kSampleStream);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t len = std::min<int64_t>(T, static_cast<int64_t>(seq.size()));
    forward(seq.data() + seq.size() - len, 1, len);
    model_.head_logits(params_[L + 1].data(), params_[0].data(), len - 1, &logits);
    // Softmax sampling by inverse CDF.
    const float mx = *std::max_element(logits.begin(), logits.end());
    double total = 0.0;
    for (float& x : logits) total += (x = std::exp(x - mx));
    double u = rng.next_uniform() * total;
    int32_t tok = static_cast<int32_t>(logits.size()) - 1;
    for (size_t k = 0; k < logits.size(); ++k) {
      u -= logits[k];
      if (u <= 0) {
        tok = static_cast<int32_t>(k);
        break;
      }
    }
    seq.push_back(tok);
    out.push_back(tok);
  }
  return out;
}

std::vector<const float*> LocalStep::params() const {
  std::vector<const float*> out;
  for (const auto& p : params_) out.push_back(p.data());
  return out;
}

std::vector<float*> LocalStep::mutable_params() {
  std::vector<float*> out;
  for (auto& p : params_) out.push_back(p.data());
  return out;
}

std::vector<const float*> LocalStep::grads() const {
  std::vector<const float*> out;
  for (const auto& g : grads_) out.push_back(g.data());
  return out;
}

}  // namespace st
