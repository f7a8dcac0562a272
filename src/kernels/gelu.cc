#include "shardtrain/kernels/gelu.h"

#include "parallel.h"
#include "shardtrain/kernels/fp8.h"
#include "vec_math.h"

namespace st {

using kernels_internal::exp_fast;
using kernels_internal::exp_range;
using kernels_internal::ExpRange;
using kernels_internal::kMinParallelWork;

// 0.5 (1 + tanh(u)) = 1 / (1 + e^{-2u}): one exp_fast instead of a tanhf call, and x * sigmoid(2u) keeps
// full relative precision for negative x, where 1 + tanh(u) cancels.
void gelu_forward(float* out, const float* inp, int64_t n, unsigned* amax) {
  const ExpRange er = exp_range();
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = gelu_tanh_arg(x);
    out[i] = x / (1.0f + exp_fast(-2.0f * u, er));
  }
  if (amax != nullptr) fp8_fold_maximum(out, n, amax);
}

// gelu' from s = sigmoid(2u) (gelu_grad_from_sigmoid).
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n, GradWrite write) {
  const ExpRange er = exp_range();
  const bool accumulate = write == GradWrite::kAccumulate;
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float s = 1.0f / (1.0f + exp_fast(-2.0f * gelu_tanh_arg(x), er));
    // dinp may alias dout when overwriting: dout[i] is read first, and dinp (maybe stale NaNs) is not read.
    const float g = gelu_grad_from_sigmoid(x, s) * dout[i];
    dinp[i] = accumulate ? dinp[i] + g : g;
  }
}

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
  // out may alias a or b: each element reads its own inputs before writing, so no restrict here.
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

}  // namespace st
