#include "shardtrain/model/recompute.h"

#include <climits>

#include "shardtrain/core/config.h"

namespace st {

Recompute recompute_of(const TrainConfig& train) {
  if (!train.recompute) return Recompute(false);
  if (train.recompute_blocks <= 0) return Recompute(true);
  return Recompute::first(static_cast<int>(std::min<int64_t>(train.recompute_blocks, INT_MAX)));
}

}  // namespace st
