#include "shardtrain/optim/loss_scaler.h"

#include <cmath>

#include "shardtrain/core/error.h"

namespace st {

LossScaler LossScaler::for_dtype(DType dtype) {
  LossScaler s;
  s.active_ = dtype == DType::kF16;
  s.scale_ = s.active_ ? kInitialScale : 1.0;
  return s;
}

void LossScaler::update(bool finite) {
  if (!active_) return;
  if (!finite) {
    scale_ *= kBackoff;
    good_steps_ = 0;
  } else if (++good_steps_ == kGrowthInterval) {
    scale_ *= kGrowth;
    good_steps_ = 0;
  }
}

void LossScaler::restore(double scale, int64_t good_steps) {
  ST_CHECK(std::isfinite(scale) && scale > 0 && good_steps >= 0, "loss scale ", scale, ", good steps ", good_steps);
  if (!active_) return;  // a bf16/fp32 run resuming an fp16 checkpoint starts unscaled
  scale_ = scale;
  good_steps_ = good_steps;
}

}  // namespace st
