// Private to src/kernels/*.cu: RoPE's turn of kVec pairs of one head, shared by the rope kernels and the decoding
// step's fused turn and cache append, so that both give the same bits.
#pragma once

#include "gpu_pack.cuh"

namespace st::gpu::kernels_internal {

// The kVec pairs (x[k], x[half + k]) turned by the angles whose cosines are c[0, kVec) and sines sign * s[0, kVec),
// as the reference's rotate: a[k] = x_k cos - x_{half+k} sin, b[k] = x_{half+k} cos + x_k sin.
template <int kVec, typename T>
__device__ __forceinline__ void rope_turn(const T* x, int half, const float* c, const float* s, float sign,
                                          float (&a)[kVec], float (&b)[kVec]) {
  load<kVec>(x, a);
  load<kVec>(x + half, b);
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const float ck = c[k], sk = sign * s[k];
    const float ak = a[k], bk = b[k];
    // Each product rounded on its own (no contraction into a fused multiply-add, which the compiler would choose
    // per kernel): every kernel that turns a head gives the same bits, and the CPU reference's.
    a[k] = __fsub_rn(__fmul_rn(ak, ck), __fmul_rn(bk, sk));
    b[k] = __fadd_rn(__fmul_rn(bk, ck), __fmul_rn(ak, sk));
  }
}

}  // namespace st::gpu::kernels_internal
