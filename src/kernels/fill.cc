#include "shardtrain/kernels/fill.h"

#include "shardtrain/core/rng.h"

namespace st {

void fill_uniform(float* out, int64_t n, uint64_t seed) {
  for (int64_t i = 0; i < n; ++i) out[i] = uniform_pm1_at(seed, static_cast<uint64_t>(i));
}

}  // namespace st
