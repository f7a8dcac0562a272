#include "shardtrain/kernels/gpu/swiglu.h"

#include "gpu_pack.cuh"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

constexpr int kBlock = 256;

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

// Visits out's N * F elements in packs of kVec (kVec divides F, so a pack never straddles two rows) and calls
// f(i, g_at, Width<W>()) for the pack at out element i = row * F + col, whose gate is gate_up element
// g_at = row * 2F + col and whose up is F further on.
template <int kVec, typename F>
__device__ __forceinline__ void for_each_gate_pack(int64_t N, int Fdim, F&& f) {
  for_each_pack<kVec>(N * Fdim, thread_index(), thread_count(), [&](int64_t i, auto w) {
    const int64_t row = i / Fdim;
    f(i, row * 2 * Fdim + (i - row * Fdim), w);
  });
}

// amax, when not null: out's maximum folded in (MaximumFold), as the backward's is dgate_up's.
template <int kVec, typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gate_up, int64_t N, int F, unsigned* amax) {
  allow_dependents();
  wait_for_predecessor();  // launched by launch_after_predecessor
  MaximumFold fold{amax};
  for_each_gate_pack<kVec>(N, F, [&](int64_t i, int64_t g_at, auto w) {
    constexpr int W = decltype(w)::value;
    float g[W], u[W];
    load<W>(gate_up + g_at, g);
    load<W>(gate_up + g_at + F, u);
    for (int k = 0; k < W; ++k) g[k] = silu(g[k]) * u[k];
    fold.store<W>(out + i, g);
  });
  fold.finish();
}

// d gate = dout * up * silu'(gate), d up = dout * silu(gate), silu'(g) = s (1 + g (1 - s)). dgate_up may alias
// gate_up: each element's inputs are loaded before its outputs are stored, by the same thread.
template <int kVec, typename T>
__global__ void swiglu_backward_kernel(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int F, bool accumulate,
                                       unsigned* amax) {
  MaximumFold fold{amax};
  for_each_gate_pack<kVec>(N, F, [&](int64_t i, int64_t g_at, auto w) {
    constexpr int W = decltype(w)::value;
    float g[W], u[W], d[W], dg[W] = {}, du[W] = {};
    load<W>(gate_up + g_at, g);
    load<W>(gate_up + g_at + F, u);
    load<W>(dout + i, d);
    if (accumulate) {
      load<W>(dgate_up + g_at, dg);
      load<W>(dgate_up + g_at + F, du);
    }
    for (int k = 0; k < W; ++k) {
      const float s = sigmoid(g[k]);
      const float dsilu = s * (1.0f + g[k] * (1.0f - s));
      dg[k] += d[k] * u[k] * dsilu;
      du[k] += d[k] * (g[k] * s);
    }
    fold.store<W>(dgate_up + g_at, dg);
    fold.store<W>(dgate_up + g_at + F, du);
  });
  fold.finish();
}

}  // namespace

template <typename T>
void swiglu_forward(T* out, const T* gate_up, int64_t N, int F, const GpuContext& ctx, unsigned* amax) {
  if (N == 0 || F == 0) return;
  constexpr int kVec = 16 / sizeof(T);
  // With F a multiple of kVec, aligned base pointers give aligned gate and up packs.
  launch_packed<T>(F % kVec == 0 && all_aligned(16, out, gate_up), [&](auto w) {
    constexpr int W = decltype(w)::value;
    launch_after_predecessor(swiglu_forward_kernel<W, T>, dim3(grid_for(N * F / W, kBlock)), dim3(kBlock), 0,
                             ctx.stream, out, gate_up, N, F, amax);
  });
}

template <typename T>
void swiglu_backward(T* dgate_up, const T* dout, const T* gate_up, int64_t N, int F, const GpuContext& ctx,
                     GradWrite write, unsigned* amax) {
  if (N == 0 || F == 0) return;
  constexpr int kVec = 16 / sizeof(T);
  launch_packed<T>(F % kVec == 0 && all_aligned(16, dgate_up, dout, gate_up), [&](auto w) {
    constexpr int W = decltype(w)::value;
    swiglu_backward_kernel<W><<<grid_for(N * F / W, kBlock), kBlock, 0, ctx.stream>>>(
        dgate_up, dout, gate_up, N, F, write == GradWrite::kAccumulate, amax);
  });
}

template void swiglu_forward<float>(float*, const float*, int64_t, int, const GpuContext&, unsigned*);
template void swiglu_forward<bf16>(bf16*, const bf16*, int64_t, int, const GpuContext&, unsigned*);
template void swiglu_forward<fp16>(fp16*, const fp16*, int64_t, int, const GpuContext&, unsigned*);
template void swiglu_backward<float>(float*, const float*, const float*, int64_t, int, const GpuContext&, GradWrite,
                                     unsigned*);
template void swiglu_backward<bf16>(bf16*, const bf16*, const bf16*, int64_t, int, const GpuContext&, GradWrite,
                                    unsigned*);
template void swiglu_backward<fp16>(fp16*, const fp16*, const fp16*, int64_t, int, const GpuContext&, GradWrite,
                                    unsigned*);

}  // namespace st::gpu
