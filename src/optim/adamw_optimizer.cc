#include "shardtrain/optim/adamw_optimizer.h"

#include <algorithm>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/adamw.h"

namespace st {

std::vector<AdamWRun> adamw_runs(const UnitLayout& unit, int64_t begin, int64_t end, const OptimConfig& cfg,
                                 const OptimizerStep& step) {
  ST_CHECK(0 <= begin && begin <= end && end <= unit.numel);
  AdamWParams p;
  p.lr = step.lr;
  p.beta1 = cfg.beta1;
  p.beta2 = cfg.beta2;
  p.eps = cfg.eps;
  p.step = step.t;
  p.grad_scale = step.grad_scale;
  std::vector<AdamWRun> runs;
  for (const TensorSpec& t : unit.tensors) {
    const int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    if (lo >= hi) continue;
    p.weight_decay = t.weight_decay ? cfg.weight_decay : 0.0f;
    runs.push_back(AdamWRun{lo - begin, hi - lo, p});
  }
  return runs;
}

void adamw_step_span(const UnitLayout& unit, int64_t begin, int64_t end, const OptimConfig& cfg,
                     const OptimizerStep& step, float* param, float* m, float* v, const float* grad) {
  adamw_update_runs(param, m, v, grad, adamw_runs(unit, begin, end, cfg, step));
}

double sum_of_squares(const float* grad, int64_t n) {
  // Partial sums over fixed chunks, added in chunk order: the same bits for any thread count and any run (an
  // OpenMP reduction combines its threads' sums in whatever order they finish).
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0.0;
    for (int64_t i = c * kChunk, end = std::min(n, (c + 1) * kChunk); i < end; ++i)
      s += static_cast<double>(grad[i]) * grad[i];
    partial[static_cast<size_t>(c)] = s;
  }
  double s = 0.0;
  for (double p : partial) s += p;
  return s;
}

float clip_coefficient(const OptimConfig& cfg, double grad_norm) { return clip_factor(cfg.grad_clip, grad_norm); }

}  // namespace st
