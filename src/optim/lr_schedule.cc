#include "shardtrain/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace st {

float lr_at(const OptimConfig& cfg, int64_t step, int64_t total_steps) {
  if (step < cfg.warmup_steps) {
    return static_cast<float>(static_cast<double>(cfg.lr) * static_cast<double>(step + 1) /
                              static_cast<double>(cfg.warmup_steps));
  }
  // Where the decay starts and how many steps it spans: every step after the warmup, or the last decay_steps.
  const int64_t start =
      cfg.decay_steps > 0 ? std::max(cfg.warmup_steps, total_steps - cfg.decay_steps) : cfg.warmup_steps;
  if (step < start) return cfg.lr;  // the stable phase
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - start));
  const double progress = std::min(1.0, static_cast<double>(step - start) / span);
  double coeff = 0.0;
  switch (cfg.decay) {
    case LrDecay::kCosine:
      coeff = 0.5 * (1.0 + std::cos(M_PI * progress));
      break;
    case LrDecay::kLinear:
      coeff = 1.0 - progress;
      break;
    case LrDecay::kSqrt:
      coeff = 1.0 - std::sqrt(progress);
      break;
  }
  return static_cast<float>(cfg.min_lr + coeff * (static_cast<double>(cfg.lr) - cfg.min_lr));
}

}  // namespace st
