#include "shardtrain/kernels/swiglu.h"

#include <cmath>
#include <vector>

#include "parallel.h"
#include "shardtrain/kernels/fp8.h"

namespace st {

using kernels_internal::kMinParallelWork;

void swiglu_forward(float* out, const float* gate_up, int64_t N, int F, unsigned* amax) {
#pragma omp parallel for schedule(static) if (N * F >= kMinParallelWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = gate_up + n * 2 * F;
    const float* u = g + F;
    float* o = out + n * F;
    for (int f = 0; f < F; ++f) o[f] = g[f] / (1.0f + std::exp(-g[f])) * u[f];
  }
  if (amax != nullptr) fp8_fold_maximum(out, N * F, amax);
}

void swiglu_forward_fp8(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, const float* gate_up, int64_t N,
                        int F, Fp8Format f, const unsigned* amax) {
  std::vector<float> out(static_cast<size_t>(N) * static_cast<size_t>(F));
  swiglu_forward(out.data(), gate_up, N, F);
  fp8_quantize_ahead(out.data(), N, F, f, amax, q, q_t, inverse_scale, own);
}

void swiglu_backward_fp8(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, const float* dout,
                         const float* gate_up, int64_t N, int F, Fp8Format f, const unsigned* amax) {
  std::vector<float> dgate_up(static_cast<size_t>(N) * 2 * static_cast<size_t>(F));
  swiglu_backward(dgate_up.data(), dout, gate_up, N, F);
  fp8_quantize_ahead(dgate_up.data(), N, 2 * int64_t{F}, f, amax, q, q_t, inverse_scale, own);
}

void swiglu_backward(float* dgate_up, const float* dout, const float* gate_up, int64_t N, int F, GradWrite write,
                     unsigned* amax) {
  const bool add = write == GradWrite::kAccumulate;
#pragma omp parallel for schedule(static) if (N * F >= kMinParallelWork)
  for (int64_t n = 0; n < N; ++n) {
    const float* g = gate_up + n * 2 * F;
    const float* u = g + F;
    const float* d = dout + n * F;
    float* dg = dgate_up + n * 2 * F;
    float* du = dg + F;
    for (int f = 0; f < F; ++f) {
      const float s = 1.0f / (1.0f + std::exp(-g[f]));
      const float silu = g[f] * s;
      const float dsilu = s * (1.0f + g[f] * (1.0f - s));
      const float vg = d[f] * u[f] * dsilu, vu = d[f] * silu;
      dg[f] = add ? dg[f] + vg : vg;
      du[f] = add ? du[f] + vu : vu;
    }
  }
  if (amax != nullptr) fp8_fold_maximum(dgate_up, N * 2 * F, amax);
}

}  // namespace st
