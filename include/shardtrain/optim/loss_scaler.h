// Dynamic loss scaling for fp16 training (PyTorch GradScaler's rule).
//
// fp16 gradients underflow to zero below 6e-8, so the loss gradient is multiplied by `scale` before
// backward and the optimizer divides it out again. If any gradient overflowed (the global norm is not
// finite), the step is skipped on every rank (the norm is all-reduced, so all agree), and the scale is
// halved; after `growth_interval` finite steps in a row it is doubled.
//
//   LossScaler s = LossScaler::for_dtype(DType::kF16);   // scale 65536; 1 and inactive otherwise
//   dloss *= s.scale();  ... backward ...  norm = raw_norm / s.scale();
//   s.update(std::isfinite(norm));
#pragma once

#include <cstdint>

#include "shardtrain/core/config.h"

namespace st {

class LossScaler {
 public:
  static constexpr double kInitialScale = 65536.0;  // 2^16, as torch.amp.GradScaler
  static constexpr double kGrowth = 2.0;
  static constexpr double kBackoff = 0.5;
  static constexpr int64_t kGrowthInterval = 2000;

  // Active (scale 2^16) for fp16; inactive (scale 1, never changes) for fp32 and bf16.
  static LossScaler for_dtype(DType dtype);

  bool active() const { return active_; }
  double scale() const { return scale_; }
  // Finite steps since the last change of scale (saved in checkpoints with the scale).
  int64_t good_steps() const { return good_steps_; }

  // After a step: finite == false halves the scale and restarts the count; kGrowthInterval finite
  // steps in a row double it. No-op when inactive.
  void update(bool finite);
  // Restores the state saved in a checkpoint (scale > 0 and finite, good_steps >= 0).
  void restore(double scale, int64_t good_steps);

 private:
  bool active_ = false;
  double scale_ = 1.0;
  int64_t good_steps_ = 0;
};

}  // namespace st
