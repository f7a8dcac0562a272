// AdamW over (a span of) each unit's flat buffer, with GPT-2's weight-decay rule taken from the layout:
// only tensors marked weight_decay (the blocks' matrices) decay; biases, LayerNorm gains and the
// embeddings do not. Works on any contiguous span [begin, end) of a unit, so a rank that owns a shard
// steps exactly the elements one process would have stepped for that range.
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/kernels/adamw.h"
#include "shardtrain/model/units.h"

namespace st {

struct OptimizerStep {
  float lr = 0;
  int64_t t = 1;          // 1-based update count, for bias correction
  float grad_scale = 1;  // clip coefficient
};

// The runs that update a shard holding elements [begin, end) of `unit`: the span split at tensor
// boundaries, each run with its tensor's decay setting. Offsets are relative to begin.
std::vector<AdamWRun> adamw_runs(const UnitLayout& unit, int64_t begin, int64_t end, const OptimConfig& cfg,
                                 const OptimizerStep& step);

// Updates param/m/v [0, end-begin), which hold elements [begin, end) of `unit`, from grad over the same.
void adamw_step_span(const UnitLayout& unit, int64_t begin, int64_t end, const OptimConfig& cfg,
                     const OptimizerStep& step, float* param, float* m, float* v, const float* grad);

// Sum of squares of grad [0, n) in double, for the global gradient norm: bit-reproducible (fixed chunks, added in
// order), whatever the thread count.
double sum_of_squares(const float* grad, int64_t n);

// The factor clipping multiplies gradients by: min(1, grad_clip / (norm + 1e-6)) (PyTorch's
// clip_grad_norm_ rule), 1 when clipping is off (grad_clip == 0).
float clip_coefficient(const OptimConfig& cfg, double grad_norm);

}  // namespace st
