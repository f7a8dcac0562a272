#include "shardtrain/kernels/gpu/rope.h"

#include "gpu_pack.cuh"
#include "rope_turn.cuh"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

constexpr int kBlock = 256;

// Turns the first NH + NKV heads of every row of qkv by +angle (sign = 1) or -angle (sign = -1), as the reference's
// rotate. A thread takes kVec consecutive pairs (j, j + half) of one head, j a multiple of kVec (kVec divides half):
// it reads both halves before it writes them, and no other thread touches them, so the update in place is safe. The
// grid-stride loop runs over rows * heads * half / kVec such pair packs. With amax (the backward's) the maximum of the
// whole of qkv folds into it (MaximumFold): the rotated heads' as they are stored, then the value heads', which are
// only read (the rest of each row, past the rotated heads).
template <int kVec, typename T>
__global__ void rope_kernel(T* qkv, const float* cos, const float* sin, int64_t rows, int64_t T_, int heads, int stride,
                            int half, float sign, const int32_t* positions, unsigned* amax) {
  MaximumFold fold{amax};
  const int64_t packs_per_head = half / kVec;
  const int64_t total = rows * heads * packs_per_head;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int j = static_cast<int>(i % packs_per_head) * kVec;
    const int64_t rh = i / packs_per_head;  // row * heads + head
    const int h = static_cast<int>(rh % heads);
    const int64_t r = rh / heads;
    const int64_t t = positions != nullptr ? positions[r] : r % T_;
    if (t < 0) continue;  // an idle row of a decoding step
    T* x = qkv + r * stride + static_cast<int64_t>(h) * 2 * half + j;
    const float* c = cos + t * half + j;
    const float* s = sin + t * half + j;
    float a[kVec], b[kVec];
    rope_turn<kVec>(x, half, c, s, sign, a, b);
    fold.store<kVec>(x, a);
    fold.store<kVec>(x + half, b);
  }
  if (amax != nullptr) {
    const int64_t rotated = static_cast<int64_t>(heads) * 2 * half, packs_per_row = (stride - rotated) / kVec;
    for (int64_t i = thread_index(); i < rows * packs_per_row; i += thread_count()) {
      const int64_t r = i / packs_per_row;
      float v[kVec];
      load<kVec>(qkv + r * stride + rotated + (i - r * packs_per_row) * kVec, v);
#pragma unroll
      for (int k = 0; k < kVec; ++k) fold.add(v[k]);
    }
  }
  fold.finish();
}

template <typename T>
void rotate(T* qkv, const float* cos, const float* sin, int64_t B, int64_t T_, int NH, int NKV, int hs,
            const GpuContext& ctx, float sign, const int32_t* positions, unsigned* amax) {
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
        qkv, cos, sin, rows, T_, heads, stride, half, sign, positions, amax);
  });
}

}  // namespace

template <typename T>
void rope_forward(T* qkv, const float* cos, const float* sin, int64_t B, int64_t T_, int NH, int NKV, int hs,
                  const GpuContext& ctx) {
  rotate(qkv, cos, sin, B, T_, NH, NKV, hs, ctx, 1.0f, nullptr, nullptr);
}

template <typename T>
void rope_backward(T* dqkv, const float* cos, const float* sin, int64_t B, int64_t T_, int NH, int NKV, int hs,
                   const GpuContext& ctx, unsigned* amax) {
  rotate(dqkv, cos, sin, B, T_, NH, NKV, hs, ctx, -1.0f, nullptr, amax);
}

template <typename T>
void rope_forward_at(T* qkv, const float* cos, const float* sin, const int32_t* positions, int64_t rows, int NH,
                     int NKV, int hs, const GpuContext& ctx) {
  rotate(qkv, cos, sin, 1, rows, NH, NKV, hs, ctx, 1.0f, positions, nullptr);
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
                                   const GpuContext&, unsigned*);
template void rope_backward<bf16>(bf16*, const float*, const float*, int64_t, int64_t, int, int, int, const GpuContext&,
                                  unsigned*);
template void rope_backward<fp16>(fp16*, const float*, const float*, int64_t, int64_t, int, int, int, const GpuContext&,
                                  unsigned*);

}  // namespace st::gpu
