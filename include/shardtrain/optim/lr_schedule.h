// Learning-rate schedule: linear warmup, lr held until the decay starts, then a decay to min_lr at the last step
// (optim.decay, optim.decay_steps; with decay_steps 0 the decay starts right after the warmup).
//
//   step < warmup:         lr * (step + 1) / warmup
//   step < start:          lr                        start = max(warmup, steps - decay_steps), or warmup
//   otherwise:             min_lr + (lr - min_lr) f(p),   p = min(1, (step - start) / max(1, steps - start))
//   f: cosine 0.5 (1 + cos(pi p)), linear 1 - p, sqrt 1 - sqrt(p)
// `step` is 0-based: the schedule position of the optimizer step about to be taken.
#pragma once

#include <cstdint>

#include "shardtrain/core/config.h"

namespace st {

float lr_at(const OptimConfig& cfg, int64_t step, int64_t total_steps);

}  // namespace st
