#include "shardtrain/kernels/gpu/lora.h"

#include <algorithm>

#include "shardtrain/core/cuda.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/kernels/gpu/matmul.h"

namespace st::gpu {
namespace {

Blas& blas_for_lora(const GpuContext& ctx) {
  ST_CHECK(ctx.blas != nullptr, "GpuContext::blas is null; LoRA needs a Blas");
  return *ctx.blas;
}

}  // namespace

template <typename T>
void lora_forward(T* out, int64_t ldo, GradWrite out_write, T* h, const T* x, const T* A, const T* B, int64_t N,
                  const LoraStack& s, float scale, const GpuContext& ctx) {
  check_lora_stack("lora_forward", N, ldo, s);
  if (N == 0) return;
  Blas& blas = blas_for_lora(ctx);
  const int64_t w = s.width(), r = s.r;
  const float beta = out_write == GradWrite::kAccumulate ? 1.0f : 0.0f;
  blas.gemm(false, true, N, w, s.in, 1.0f, x, s.in, 0, A, s.in, 0, 0.0f, h, w, 0, 1, ctx.stream);
  const T* Bj = B;
  for (size_t j = 0; j < s.slices.size(); ++j) {
    const LoraSlice& sl = s.slices[j];
    blas.gemm(false, true, N, sl.rows, r, scale, h + j * r, w, 0, Bj, r, 0, beta, out + sl.row0, ldo, 0, 1, ctx.stream);
    Bj += sl.rows * r;
  }
}

template <typename T>
void lora_backward(T* dx, GradWrite dx_write, T* dA, T* dB, T* dh, const T* dout, int64_t ldo, const T* x, const T* h,
                   const T* A, const T* B, int64_t N, const LoraStack& s, float scale, const GpuContext& ctx,
                   GradWrite param_write) {
  check_lora_stack("lora_backward", N, ldo, s);
  const bool add = param_write == GradWrite::kAccumulate;
  const int64_t w = s.width(), r = s.r;
  if (N == 0) {  // no rows: the written gradients are the empty sums (a GEMM of depth 0 may have no algorithm)
    if (!add) {
      ST_CUDA_CHECK(cudaMemsetAsync(dA, 0, sizeof(T) * static_cast<size_t>(w * s.in), ctx.stream));
      ST_CUDA_CHECK(cudaMemsetAsync(dB, 0, sizeof(T) * static_cast<size_t>(s.b_rows() * r), ctx.stream));
    }
    return;
  }
  Blas& blas = blas_for_lora(ctx);
  const float beta = add ? 1.0f : 0.0f;
  int64_t b_row = 0;
  for (size_t j = 0; j < s.slices.size(); ++j) {
    const LoraSlice& sl = s.slices[j];
    const T* g = dout + sl.row0;
    blas.gemm(false, false, N, r, sl.rows, scale, g, ldo, 0, B + b_row * r, r, 0, 0.0f, dh + j * r, w, 0, 1,
              ctx.stream);
    blas.gemm(true, false, sl.rows, r, N, scale, g, ldo, 0, h + j * r, w, 0, beta, dB + b_row * r, r, 0, 1, ctx.stream);
    b_row += sl.rows;
  }
  blas.gemm(true, false, w, s.in, N, 1.0f, dh, w, 0, x, s.in, 0, beta, dA, s.in, 0, 1, ctx.stream);
  if (dx != nullptr)
    blas.gemm(false, false, N, s.in, w, 1.0f, dh, w, 0, A, s.in, 0, dx_write == GradWrite::kAccumulate ? 1.0f : 0.0f,
              dx, s.in, 0, 1, ctx.stream);
}

namespace {

__device__ __forceinline__ float dropout_factor(const LoraDropoutKey& k, int64_t n, int in, int c, float inv) {
  const int64_t sequence = k.first_sequence + n / k.rows_per_sequence, position = n % k.rows_per_sequence;
  const uint64_t index = static_cast<uint64_t>((sequence * k.seq_stride + position) * in + c);
  const float u = static_cast<float>(random_bits_at(k.seed, k.stream, index) >> 40) * (1.0f / 16777216.0f);
  return u >= k.p ? inv : 0.0f;
}

// One thread an element: the hash is the cost, and it needs the element's row and column.
template <typename T>
__global__ void dropout_kernel(T* out, const T* x, int64_t N, int in, LoraDropoutKey key, float inv) {
  const int64_t total = N * in;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / in;
    const int c = static_cast<int>(i - n * in);
    out[i] = static_cast<T>(static_cast<float>(x[i]) * dropout_factor(key, n, in, c, inv));
  }
}

template <typename T>
__global__ void dropout_backward_kernel(T* dx, const T* dxd, int64_t N, int in, LoraDropoutKey key, float inv) {
  const int64_t total = N * in;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / in;
    const int c = static_cast<int>(i - n * in);
    dx[i] = static_cast<T>(static_cast<float>(dx[i]) + static_cast<float>(dxd[i]) * dropout_factor(key, n, in, c, inv));
  }
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536)); }

}  // namespace

template <typename T>
void lora_dropout(T* out, const T* x, int64_t N, int in, const LoraDropoutKey& key, const GpuContext& ctx) {
  if (N * in == 0) return;
  dropout_kernel<T><<<blocks_for(N * in), 256, 0, ctx.stream>>>(out, x, N, in, key, 1.0f / (1.0f - key.p));
  ST_CUDA_CHECK_LAUNCH();
}

template <typename T>
void lora_dropout_backward(T* dx, T* dxd, const T* dh, const T* A, int64_t N, int in, int r, const LoraDropoutKey& key,
                           const GpuContext& ctx) {
  if (N == 0) return;
  blas_for_lora(ctx).gemm(false, false, N, in, r, 1.0f, dh, r, 0, A, in, 0, 0.0f, dxd, in, 0, 1, ctx.stream);
  dropout_backward_kernel<T><<<blocks_for(N * in), 256, 0, ctx.stream>>>(dx, dxd, N, in, key, 1.0f / (1.0f - key.p));
  ST_CUDA_CHECK_LAUNCH();
}

#define ST_INSTANTIATE_LORA(T)                                                                                         \
  template void lora_forward<T>(T*, int64_t, GradWrite, T*, const T*, const T*, const T*, int64_t, const LoraStack&,   \
                                float, const GpuContext&);                                                             \
  template void lora_backward<T>(T*, GradWrite, T*, T*, T*, const T*, int64_t, const T*, const T*, const T*, const T*, \
                                 int64_t, const LoraStack&, float, const GpuContext&, GradWrite);                      \
  template void lora_dropout<T>(T*, const T*, int64_t, int, const LoraDropoutKey&, const GpuContext&);                 \
  template void lora_dropout_backward<T>(T*, T*, const T*, const T*, int64_t, int, int, const LoraDropoutKey&,         \
                                         const GpuContext&);

ST_INSTANTIATE_LORA(float)
ST_INSTANTIATE_LORA(bf16)
ST_INSTANTIATE_LORA(fp16)
#undef ST_INSTANTIATE_LORA

}  // namespace st::gpu
