#include "shardtrain/kernels/gpu/rope.h"

#include "gpu_pack.cuh"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

constexpr int kBlock = 256;

// Turns the first NH + NKV heads of every row of qkv by +angle (sign = 1) or -angle (sign = -1), as the reference's
// rotate. A thread takes kVec consecutive pairs (j, j + half) of one head, j a multiple of kVec (kVec divides half):
// it reads both halves before it writes them, and no other thread touches them, so the update in place is safe. The
// grid-stride loop runs over rows * heads * half / kVec such pair packs.
template <int kVec, typename T>
__global__ void rope_kernel(T* qkv, const float* cos, const float* sin, int64_t rows, int64_t T_, int heads, int stride,
                            int half, float sign, const int32_t* positions) {
  const int64_t packs_per_head = half / kVec;
  const int64_t total = rows * heads * packs_per_head;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int j = static_cast<int>(i % packs_per_head) * kVec;
    const int64_t rh = i / packs_per_head;  // row * heads + head
    const int h = static_cast<int>(rh % heads);
    const int64_t r = rh / heads;
    const int64_t t = positions != nullptr ? positions[r] : r % T_;
    T* x = qkv + r * stride + static_cast<int64_t>(h) * 2 * half + j;
    const float* c = cos + t * half + j;
    const float* s = sin + t * half + j;
    float a[kVec], b[kVec];
    load<kVec>(x, a);
    load<kVec>(x + half, b);
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float ck = c[k], sk = sign * s[k];
      const float ak = a[k], bk = b[k];
      a[k] = ak * ck - bk * sk;
      b[k] = bk * ck + ak * sk;
    }
    store<kVec>(x, a);
    store<kVec>(x + half, b);
  }
}

template <typename T>
void rotate(T* qkv, const float* cos, const float* sin, int64_t B, int64_t T_, int NH, int NKV, int hs,
            const GpuContext& ctx, float sign, const int32_t* positions = nullptr) {
  ST_CHECK(hs % 2 == 0, "RoPE needs an even head dimension, got ", hs);
  const int64_t rows = B * T_;
  const int heads = NH + NKV;
  const int half = hs / 2;
  if (rows == 0 || heads == 0 || half == 0) return;
  const int stride = (NH + 2 * NKV) * hs;
  constexpr int kVec = 16 / sizeof(T);
  // With half a multiple of kVec, every head's halves start kVec-aligned from an aligned base.
  launch_packed<T>(half % kVec == 0 && all_aligned(16, qkv), [&](auto w) {
    constexpr int W = decltype(w)::value;
    rope_kernel<W><<<grid_for(rows * heads * (half / W), kBlock), kBlock, 0, ctx.stream>>>(
        qkv, cos, sin, rows, T_, heads, stride, half, sign, positions);
  });
}

}  // namespace

template <typename T>
void rope_forward(T* qkv, const float* cos, const float* sin, int64_t B, int64_t T_, int NH, int NKV, int hs,
                  const GpuContext& ctx) {
  rotate(qkv, cos, sin, B, T_, NH, NKV, hs, ctx, 1.0f);
}

template <typename T>
void rope_backward(T* dqkv, const float* cos, const float* sin, int64_t B, int64_t T_, int NH, int NKV, int hs,
                   const GpuContext& ctx) {
  rotate(dqkv, cos, sin, B, T_, NH, NKV, hs, ctx, -1.0f);
}

template <typename T>
void rope_forward_at(T* qkv, const float* cos, const float* sin, const int32_t* positions, int64_t rows, int NH,
                     int NKV, int hs, const GpuContext& ctx) {
  rotate(qkv, cos, sin, 1, rows, NH, NKV, hs, ctx, 1.0f, positions);
}

template void rope_forward_at<float>(float*, const float*, const float*, const int32_t*, int64_t, int, int, int,
                                     const GpuContext&);
template void rope_forward_at<bf16>(bf16*, const float*, const float*, const int32_t*, int64_t, int, int, int,
                                    const GpuContext&);
template void rope_forward_at<fp16>(fp16*, const float*, const float*, const int32_t*, int64_t, int, int, int,
                                    const GpuContext&);
template void rope_forward<float>(float*, const float*, const float*, int64_t, int64_t, int, int, int,
                                  const GpuContext&);
template void rope_forward<bf16>(bf16*, const float*, const float*, int64_t, int64_t, int, int, int, const GpuContext&);
template void rope_forward<fp16>(fp16*, const float*, const float*, int64_t, int64_t, int, int, int, const GpuContext&);
template void rope_backward<float>(float*, const float*, const float*, int64_t, int64_t, int, int, int,
                                   const GpuContext&);
template void rope_backward<bf16>(bf16*, const float*, const float*, int64_t, int64_t, int, int, int,
                                  const GpuContext&);
template void rope_backward<fp16>(fp16*, const float*, const float*, int64_t, int64_t, int, int, int,
                                  const GpuContext&);

}  // namespace st::gpu
