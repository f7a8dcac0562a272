// Private to src/kernels/*.cu: the two device steps of a cast whose maximum is known ahead (train.fp8=delayed: the
// history's), st::fp8_quantize_ahead's rule, shared by kernels/fp8.cu's casts ahead and kernels/swiglu.cu's fused ones.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace st::gpu::kernels_internal {

// The scale of the maximum known ahead, as st::fp8_scale's float steps: 1 for a maximum of 0 (an operand 0 throughout
// its history), NaN for a non-finite one (every code then NaN's).
__device__ __forceinline__ float scale_ahead(unsigned amax_bits, float fp8_max) {
  const float amax = __uint_as_float(amax_bits);
  if (amax_bits == 0) return 1.0f;
  return isfinite(amax) ? __fdiv_rn(fp8_max, fmaxf(amax, 1e-12f)) : __int_as_float(0x7fffffff);
}

// An element's code under such a scale: NaN's (0x7f, either format) for a non-finite element or scale, so that a GEMM
// reading it turns NaN; a finite product past the format's range saturates, as st::fp8_encode does.
__device__ __forceinline__ uint8_t code_ahead(float v, float scale, __nv_fp8_interpretation_t format) {
  if (!isfinite(v) || !isfinite(scale)) return 0x7f;
  return __nv_cvt_float_to_fp8(__fmul_rn(v, scale), __NV_SATFINITE, format);
}

}  // namespace st::gpu::kernels_internal
