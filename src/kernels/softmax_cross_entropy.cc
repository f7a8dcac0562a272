#include "shardtrain/kernels/softmax_cross_entropy.h"

#include <algorithm>
#include <cmath>

#include "parallel.h"
#include "shardtrain/core/error.h"
#include "vec_math.h"

namespace st {

using kernels_internal::exp_fast;
using kernels_internal::exp_range;
using kernels_internal::ExpRange;
using kernels_internal::kMinParallelWork;

void softmax_cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int64_t N, int V,
                           int Vp, float dloss) {
  ST_CHECK(V > 0 && V <= Vp, "V = ", V, ", Vp = ", Vp);
  // Validated up front: an exception cannot leave the parallel region, and a bad target would read
  // outside the row.
  for (int64_t n = 0; n < N; ++n) {
    ST_CHECK(targets[n] < V, "targets[", n, "] = ", targets[n], " not in [0, ", V, ") nor < 0 (not a target)");
  }
  const ExpRange er = exp_range();
#pragma omp parallel for schedule(static) if (N * V >= kMinParallelWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * Vp;
    const int tgt = targets[n];
    if (tgt < 0) {  // not a target: no loss, no gradient
      losses[n] = 0.0f;
      if (dlogits != nullptr) std::fill(dlogits + n * Vp, dlogits + (n + 1) * Vp, 0.0f);
      continue;
    }
    // Everything needed from the row is read before dlogits (which may alias logits) is written.
    const float x_tgt = x[tgt];
    float mx = x[0];
#pragma omp simd reduction(max : mx)
    for (int i = 0; i < V; ++i) mx = x[i] > mx ? x[i] : mx;
    // The same loop with or without dlogits, so the losses do not depend on whether a gradient is asked.
    double sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < V; ++i) sum += exp_fast(x[i] - mx, er);
    losses[n] = static_cast<float>(std::log(sum) + static_cast<double>(mx) - static_cast<double>(x_tgt));
    if (dlogits != nullptr) {
      float* d = dlogits + n * Vp;
      const float scale = static_cast<float>(dloss / sum);
      // In place, x[i] is read before d[i] is written; x_tgt was saved above.
#pragma omp simd
      for (int i = 0; i < V; ++i) d[i] = exp_fast(x[i] - mx, er) * scale;
      d[tgt] -= dloss;
      for (int i = V; i < Vp; ++i) d[i] = 0.0f;
    }
  }
}

}  // namespace st
