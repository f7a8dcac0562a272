#include "gemv.cuh"

#include <cstring>

#include "gpu_pack.cuh"
#include "shardtrain/core/error.h"

namespace st::gpu::kernels_internal {
namespace {

// A decoding step's products read each weight once and do two flops per element: their time is the weights' bytes
// over the memory bandwidth, if enough of them are in flight. One warp per output column o: its lanes stream W's row
// o in packs (16 bytes), kDepth packs each in flight at once, every row of x against them, fp32 sums reduced across
// the warp; then residual + bias + product, rounded to T once (as the fused cuBLASLt epilogue rounds it).
constexpr int kGemvWarps = 8;
constexpr int kDepth = 8;

// A pack of the weights, read with the evict-first hint: they are streamed once a forward through an L2 they do not
// fit, which had better keep the activations and the key/value caches.
template <int kVec, typename T>
__device__ __forceinline__ Pack<T, kVec> load_streaming(const T* p) {
  Pack<T, kVec> pk;
  if constexpr (sizeof(pk) == 16) {
    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
    memcpy(&pk, &v, sizeof(pk));
  } else {
    pk = *reinterpret_cast<const Pack<T, kVec>*>(p);
  }
  return pk;
}

template <int kVec, bool kNorm, typename T>
__global__ void __launch_bounds__(kGemvWarps* kWarpSize)
    gemv_kernel(T* out, const T* inp, const T* norm_weight, float eps, const T* weight, const T* bias,
                const T* residual, int rows, int C, int OC) {
  allow_dependents();
  constexpr int kStride = kWarpSize * kVec;  // the elements of a warp's packs side by side
  const int lane = threadIdx.x % kWarpSize;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / kWarpSize;
  const bool live = o < OC;
  const T* w = weight + (live ? o : 0) * C;
  // The first kDepth packs of the lane's share of row o, read while the kernel that writes inp may still run: the
  // weights do not change during a forward.
  Pack<T, kVec> wp[kDepth];
#pragma unroll
  for (int u = 0; u < kDepth; ++u) {
    const int k = lane * kVec + u * kStride;
    if (live && k < C) wp[u] = load_streaming<kVec>(w + k);
  }
  wait_for_predecessor();
  if (!live) return;
  float rstd[kGemvMaxRows];
  if constexpr (kNorm) {
    // rmsnorm_forward's sum of squares: a lane's packs in order, then the butterfly.
#pragma unroll
    for (int r = 0; r < kGemvMaxRows; ++r) {
      if (r >= rows) break;
      float ss = 0.0f;
      for (int k = lane * kVec; k < C; k += kStride) {
        float v[kVec];
        load<kVec>(inp + static_cast<int64_t>(r) * C + k, v);
#pragma unroll
        for (int j = 0; j < kVec; ++j) ss += v[j] * v[j];
      }
      rstd[r] = 1.0f / sqrtf(warp_reduce(ss, Add()) / C + eps);
    }
  }
  float acc[kGemvMaxRows] = {};
  for (int k0 = 0; k0 < C; k0 += kDepth * kStride) {
    if (k0 > 0) {
#pragma unroll
      for (int u = 0; u < kDepth; ++u) {
        const int k = k0 + lane * kVec + u * kStride;
        if (k < C) wp[u] = load_streaming<kVec>(w + k);
      }
    }
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int k = k0 + lane * kVec + u * kStride;
      if (k >= C) break;
      float wv[kVec], g[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) wv[j] = to_f32(wp[u].v[j]);
      if constexpr (kNorm) load<kVec>(norm_weight + k, g);
#pragma unroll
      for (int r = 0; r < kGemvMaxRows; ++r) {
        if (r >= rows) break;
        float xv[kVec];
        load<kVec>(inp + static_cast<int64_t>(r) * C + k, xv);
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          const float x = kNorm ? to_f32(from_f32<T>(xv[j] * rstd[r] * g[j])) : xv[j];
          acc[r] += x * wv[j];
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    if (r >= rows) break;
    const float sum = warp_reduce(acc[r], Add());
    if (lane == 0) {
      const int64_t at = static_cast<int64_t>(r) * OC + o;
      float v = sum;
      if (bias != nullptr) v += to_f32(bias[o]);
      if (residual != nullptr) v += to_f32(residual[at]);
      out[at] = from_f32<T>(v);
    }
  }
}

}  // namespace

template <typename T>
void gemv(T* out, const T* inp, const T* norm_weight, float eps, const T* weight, const T* bias, const T* residual,
          int64_t rows, int C, int OC, const GpuContext& ctx) {
  ST_CHECK(rows >= 1 && rows <= kGemvMaxRows, "gemv takes 1 to ", kGemvMaxRows, " rows, got ", rows);
  if (OC == 0) return;
  constexpr int kVec = 16 / sizeof(T);
  const dim3 grid(static_cast<unsigned>((OC + kGemvWarps - 1) / kGemvWarps)), block(kGemvWarps * kWarpSize);
  launch_packed<T>(C % kVec == 0 && all_aligned(16, inp, weight, norm_weight), [&](auto w) {
    constexpr int W = decltype(w)::value;
    if (norm_weight != nullptr)
      launch_after_predecessor(gemv_kernel<W, true, T>, grid, block, 0, ctx.stream, out, inp, norm_weight, eps, weight,
                               bias, residual, static_cast<int>(rows), C, OC);
    else
      launch_after_predecessor(gemv_kernel<W, false, T>, grid, block, 0, ctx.stream, out, inp, norm_weight, eps, weight,
                               bias, residual, static_cast<int>(rows), C, OC);
  });
}

#define ST_GEMV_INSTANTIATE(T)                                                                          \
  template void gemv<T>(T*, const T*, const T*, float, const T*, const T*, const T*, int64_t, int, int, \
                        const GpuContext&);
ST_GEMV_INSTANTIATE(float)
ST_GEMV_INSTANTIATE(bf16)
ST_GEMV_INSTANTIATE(fp16)
#undef ST_GEMV_INSTANTIATE

}  // namespace st::gpu::kernels_internal
