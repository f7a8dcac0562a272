#include "shardtrain/kernels/gelu.h"

#include "gpu_pack.cuh"
#include "shardtrain/kernels/gpu/gelu.h"

namespace st::gpu {

using namespace kernels_internal;  // gpu_pack.cuh

namespace {

constexpr int kBlock = 256;

// As the reference: 0.5 (1 + tanh(u)) = sigmoid(2u), and x * sigmoid(2u) keeps full relative precision
// for negative x, where 1 + tanh(u) cancels. For x << 0, expf overflows to inf and the result is -0.
__device__ __forceinline__ float gelu(float x) {
  const float u = gelu_tanh_arg(x);
  return x / (1.0f + expf(-2.0f * u));
}

__device__ __forceinline__ float gelu_grad(float x) {
  const float s = 1.0f / (1.0f + expf(-2.0f * gelu_tanh_arg(x)));
  return gelu_grad_from_sigmoid(x, s);
}

// amax, when not null: out's maximum folded in (MaximumFold).
template <int kVec, typename T>
__global__ void gelu_forward_kernel(T* out, const T* inp, int64_t n, unsigned* amax) {
  MaximumFold fold{amax};
  for_each_pack<kVec>(n, thread_index(), thread_count(), [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float x[W];
    load<W>(inp + i, x);
    for (int k = 0; k < W; ++k) x[k] = gelu(x[k]);
    fold.store<W>(out + i, x);
  });
  fold.finish();
}

template <int kVec, typename T>
__global__ void gelu_backward_kernel(T* dinp, const T* inp, const T* dout, int64_t n, bool accumulate) {
  // dinp may alias dout: each element's inputs are loaded before its output is stored, by the same thread.
  for_each_pack<kVec>(n, thread_index(), thread_count(), [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float x[W], d[W], g[W] = {};
    load<W>(inp + i, x);
    load<W>(dout + i, d);
    if (accumulate) load<W>(dinp + i, g);
    for (int k = 0; k < W; ++k) g[k] += gelu_grad(x[k]) * d[k];
    store<W>(dinp + i, g);
  });
}

// Aliasing is safe: each element's inputs are loaded before its output is stored, by the same thread.
template <int kVec, typename T>
__global__ void residual_forward_kernel(T* out, const T* a, const T* b, int64_t n) {
  for_each_pack<kVec>(n, thread_index(), thread_count(), [&](int64_t i, auto w) {
    constexpr int W = decltype(w)::value;
    float x[W], y[W];
    load<W>(a + i, x);
    load<W>(b + i, y);
    for (int k = 0; k < W; ++k) x[k] += y[k];
    store<W>(out + i, x);
  });
}

}  // namespace

template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n, const GpuContext& ctx, unsigned* amax) {
  if (n == 0) return;
  launch_packed<T>(all_aligned(16, out, inp), [&](auto w) {
    constexpr int kVec = decltype(w)::value;
    gelu_forward_kernel<kVec><<<grid_for((n + kVec - 1) / kVec, kBlock), kBlock, 0, ctx.stream>>>(out, inp, n, amax);
  });
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n, const GpuContext& ctx, GradWrite write) {
  if (n == 0) return;
  launch_packed<T>(all_aligned(16, dinp, inp, dout), [&](auto w) {
    constexpr int kVec = decltype(w)::value;
    gelu_backward_kernel<kVec><<<grid_for((n + kVec - 1) / kVec, kBlock), kBlock, 0, ctx.stream>>>(
        dinp, inp, dout, n, write == GradWrite::kAccumulate);
  });
}

template <typename T>
void residual_forward(T* out, const T* a, const T* b, int64_t n, const GpuContext& ctx) {
  if (n == 0) return;
  launch_packed<T>(all_aligned(16, out, a, b), [&](auto w) {
    constexpr int kVec = decltype(w)::value;
    residual_forward_kernel<kVec><<<grid_for((n + kVec - 1) / kVec, kBlock), kBlock, 0, ctx.stream>>>(out, a, b, n);
  });
}

template void gelu_forward<float>(float*, const float*, int64_t, const GpuContext&, unsigned*);
template void gelu_forward<bf16>(bf16*, const bf16*, int64_t, const GpuContext&, unsigned*);
template void gelu_forward<fp16>(fp16*, const fp16*, int64_t, const GpuContext&, unsigned*);
template void gelu_backward<float>(float*, const float*, const float*, int64_t, const GpuContext&, GradWrite);
template void gelu_backward<bf16>(bf16*, const bf16*, const bf16*, int64_t, const GpuContext&, GradWrite);
template void gelu_backward<fp16>(fp16*, const fp16*, const fp16*, int64_t, const GpuContext&, GradWrite);
template void residual_forward<float>(float*, const float*, const float*, int64_t, const GpuContext&);
template void residual_forward<bf16>(bf16*, const bf16*, const bf16*, int64_t, const GpuContext&);
template void residual_forward<fp16>(fp16*, const fp16*, const fp16*, int64_t, const GpuContext&);

}  // namespace st::gpu
