// Learning-rate schedule: linear warmup, then cosine decay to min_lr at the last step.
//
//   step < warmup:   lr * (step + 1) / warmup
//   otherwise:       min_lr + 0.5 (lr - min_lr) (1 + cos(pi * (step - warmup) / max(1, steps - warmup)))
// `step` is 0-based: the schedule position of the optimizer step about to be taken.
#pragma once

#include <cstdint>

#include "shardtrain/core/config.h"

namespace st {

float lr_at(const OptimConfig& cfg, int64_t step, int64_t total_steps);

}  // namespace st
