#include "shardtrain/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace st {

float lr_at(const OptimConfig& cfg, int64_t step, int64_t total_steps) {
  if (step < cfg.warmup_steps) {
    return static_cast<float>(static_cast<double>(cfg.lr) * static_cast<double>(step + 1) /
                              static_cast<double>(cfg.warmup_steps));
  }
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - cfg.warmup_steps));
  const double progress = std::min(1.0, static_cast<double>(step - cfg.warmup_steps) / span);
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * progress));
  return static_cast<float>(cfg.min_lr + coeff * (static_cast<double>(cfg.lr) - cfg.min_lr));
}

}  // namespace st
