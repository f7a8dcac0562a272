// One optimizer step on a single process holding every unit in full: the fp32 reference path that the
// sharded engine must reproduce. Owns the parameters, gradients, AdamW moments and the model.
//
//   LocalStep s(cfg);
//   float loss = s.forward_backward(batch_fn, accum);   // grads now hold the step's mean gradient
//   StepStats st = s.optimizer_step(step, loss);         // norm, clip, skip-if-non-finite, AdamW
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/gpt.h"

namespace st {

// Fills micro-batch `micro_step` of the current step: inputs and targets, each [micro_batch, seq_len].
using BatchFn = std::function<void(int64_t micro_step, int32_t* inputs, int32_t* targets)>;

struct StepStats {
  float loss = 0;
  double grad_norm = 0;  // before clipping
  float lr = 0;
  bool skipped = false;  // non-finite loss or norm: no update was applied
};

class LocalStep {
 public:
  explicit LocalStep(const Config& cfg);

  // Zeroes the gradients, then runs `accum` micro-steps of forward+backward, accumulating the gradient
  // of the mean loss over all accum*B*T tokens. Returns that mean loss.
  float forward_backward(const BatchFn& batch, int64_t accum);

  // The global gradient norm, clipping, a skip on non-finite loss/norm, and AdamW with the scheduled lr
  // for 0-based `step`. The update count used for bias correction advances only on applied steps.
  StepStats optimizer_step(int64_t step, float loss);

  // Mean loss over `batches` micro-batches, no gradients.
  float evaluate(const BatchFn& batch, int64_t batches);

  // Samples `n` tokens continuing `prompt` (temperature 1, top-k off), each from a forward over at most
  // seq_len trailing tokens. Deterministic in (seed).
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, int64_t n, uint64_t seed);

  std::vector<const float*> params() const;
  std::vector<float*> mutable_params();
  std::vector<const float*> grads() const;
  const std::vector<UnitLayout>& units() const { return model_.units(); }
  int64_t updates() const { return updates_; }

 private:
  void forward(const int32_t* inputs, int64_t B, int64_t T);

  Config cfg_;
  GptModel model_;
  std::vector<std::vector<float>> params_, grads_, m_, v_;
  std::vector<int32_t> inputs_, targets_;
  int64_t updates_ = 0;
};

}  // namespace st
