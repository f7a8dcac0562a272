#include "shardtrain/kernels/gpu/swiglu.h"

#include <cuda_fp8.h>

#include <algorithm>

#include "fp8_ahead.cuh"
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

// One element's gradients added to dg and du (0 where they are written): the one definition of both kernels that
// compute them (swiglu_backward's and swiglu_backward_fp8's), so that they take the same bits.
__device__ __forceinline__ void add_swiglu_grad(float g, float u, float d, float& dg, float& du) {
  const float s = sigmoid(g);
  const float dsilu = s * (1.0f + g * (1.0f - s));
  dg += d * u * dsilu;
  du += d * (g * s);
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
    for (int k = 0; k < W; ++k) add_swiglu_grad(g[k], u[k], d[k], dg[k], du[k]);
    fold.store<W>(dgate_up + g_at, dg);
    fold.store<W>(dgate_up + g_at + F, du);
  });
  fold.finish();
}

// swiglu_forward_fp8: out's element as swiglu_forward<T> stores it, which code_ahead (fp8_ahead.cuh) then casts.
template <typename T>
__device__ __forceinline__ float stored_out(float g, float u) {
  return to_f32(from_f32<T>(silu(g) * u));
}

// Rows and columns multiples of 8: 64 x 64 tiles of out, 256 threads, each computing 8 consecutive elements of a row
// from one load of their gates and one of their ups, storing their 8 codes in out's layout and into a tile at
// [column][row], from which the tile's transposed rows are stored 8 codes at a time (the pair cast's tile,
// kernels/fp8.cu).
constexpr int kFp8Tile = 64, kFp8Vec = 8;

// The tile kernels' second phase: a tile of codes held [column][row] stored as rows of q_t [., N], the tile's column
// j (of columns c0 + j < cols) into q_t's row first + c0 + j, 8 codes a thread at a time.
__device__ __forceinline__ void store_tile_transposed(const uint8_t (&tile)[kFp8Tile][kFp8Tile + 8], uint8_t* q_t,
                                                      int64_t first, int64_t r0, int64_t c0, int64_t N, int64_t cols) {
  const int lane = static_cast<int>(threadIdx.x) % 8, line = static_cast<int>(threadIdx.x) / 8;
  for (int j = line; j < kFp8Tile; j += kBlock / 8) {
    const int64_t cc = c0 + j, r = r0 + lane * kFp8Vec;
    if (cc >= cols || r >= N) continue;
    Pack<uint8_t, kFp8Vec> out;
#pragma unroll
    for (int k = 0; k < kFp8Vec; ++k) out.v[k] = tile[j][lane * kFp8Vec + k];
    *reinterpret_cast<Pack<uint8_t, kFp8Vec>*>(q_t + (first + cc) * N + r) = out;
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlock)
    swiglu_fp8_tile_kernel(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, const T* gate_up, int64_t N,
                           int F, float fp8_max, __nv_fp8_interpretation_t format, const unsigned* amax) {
  __shared__ uint8_t tile[kFp8Tile][kFp8Tile + 8];  // [column of out][row of out]
  const float scale = scale_ahead(*amax, fp8_max);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *inverse_scale = __fdiv_rn(1.0f, scale);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kFp8Tile, c0 = static_cast<int64_t>(blockIdx.y) * kFp8Tile;
  const int lane = static_cast<int>(threadIdx.x) % 8, line = static_cast<int>(threadIdx.x) / 8;  // 8 x 32 threads
  MaximumFold fold{own};
  for (int i = line; i < kFp8Tile; i += kBlock / 8) {
    const int64_t r = r0 + i, c = c0 + lane * kFp8Vec;
    if (r >= N || c >= F) continue;
    float g[kFp8Vec], u[kFp8Vec];
    load<kFp8Vec>(gate_up + r * 2 * F + c, g);
    load<kFp8Vec>(gate_up + r * 2 * F + F + c, u);
    Pack<uint8_t, kFp8Vec> codes;
#pragma unroll
    for (int k = 0; k < kFp8Vec; ++k) {
      const float v = stored_out<T>(g[k], u[k]);
      if (own != nullptr) fold.bits = max(fold.bits, __float_as_uint(fabsf(v)));
      codes.v[k] = code_ahead(v, scale, format);
      tile[lane * kFp8Vec + k][i] = codes.v[k];
    }
    if (q != nullptr) *reinterpret_cast<Pack<uint8_t, kFp8Vec>*>(q + r * F + c) = codes;
  }
  fold.finish();
  if (q_t == nullptr) return;  // uniform over the grid
  __syncthreads();
  store_tile_transposed(tile, q_t, 0, r0, c0, N, F);
}

// Any shape: an element a thread (a grid-stride loop), the transposed codes stored one byte at a time.
template <typename T>
__global__ void __launch_bounds__(kBlock)
    swiglu_fp8_kernel(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, const T* gate_up, int64_t N, int F,
                      float fp8_max, __nv_fp8_interpretation_t format, const unsigned* amax) {
  const float scale = scale_ahead(*amax, fp8_max);
  if (blockIdx.x == 0 && threadIdx.x == 0) *inverse_scale = __fdiv_rn(1.0f, scale);
  MaximumFold fold{own};
  for (int64_t i = thread_index(); i < N * F; i += thread_count()) {
    const int64_t r = i / F, c = i - r * F;
    const float v = stored_out<T>(to_f32(gate_up[r * 2 * F + c]), to_f32(gate_up[r * 2 * F + F + c]));
    if (own != nullptr) fold.bits = max(fold.bits, __float_as_uint(fabsf(v)));
    const uint8_t code = code_ahead(v, scale, format);
    if (q != nullptr) q[i] = code;
    if (q_t != nullptr) q_t[c * N + r] = code;
  }
  fold.finish();
}

// swiglu_backward_fp8: an element's two gradients (written: from 0, as swiglu_backward's kOverwrite) as
// swiglu_backward<T> stores them.
template <typename T>
__device__ __forceinline__ void stored_grads(float g, float u, float d, float& dg, float& du) {
  dg = 0.0f;
  du = 0.0f;
  add_swiglu_grad(g, u, d, dg, du);
  dg = to_f32(from_f32<T>(dg));
  du = to_f32(from_f32<T>(du));
}

// swiglu_fp8_tile_kernel's layout for dgate_up: a 64 x 64 tile of [N, F] gives the tile's gate gradients (columns c)
// and up gradients (columns F + c), each stored 8 codes at a time in dgate_up's layout and through a tile of their own
// transposed.
template <typename T>
__global__ void __launch_bounds__(kBlock)
    swiglu_grad_fp8_tile_kernel(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, const T* dout,
                                const T* gate_up, int64_t N, int F, float fp8_max, __nv_fp8_interpretation_t format,
                                const unsigned* amax) {
  __shared__ uint8_t tiles[2][kFp8Tile][kFp8Tile + 8];  // gate's and up's, [column][row]
  const float scale = scale_ahead(*amax, fp8_max);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *inverse_scale = __fdiv_rn(1.0f, scale);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kFp8Tile, c0 = static_cast<int64_t>(blockIdx.y) * kFp8Tile;
  const int lane = static_cast<int>(threadIdx.x) % 8, line = static_cast<int>(threadIdx.x) / 8;
  MaximumFold fold{own};
  for (int i = line; i < kFp8Tile; i += kBlock / 8) {
    const int64_t r = r0 + i, c = c0 + lane * kFp8Vec;
    if (r >= N || c >= F) continue;
    float g[kFp8Vec], u[kFp8Vec], d[kFp8Vec];
    load<kFp8Vec>(gate_up + r * 2 * F + c, g);
    load<kFp8Vec>(gate_up + r * 2 * F + F + c, u);
    load<kFp8Vec>(dout + r * F + c, d);
    Pack<uint8_t, kFp8Vec> codes[2];
#pragma unroll
    for (int k = 0; k < kFp8Vec; ++k) {
      float v[2];
      stored_grads<T>(g[k], u[k], d[k], v[0], v[1]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (own != nullptr) fold.bits = max(fold.bits, __float_as_uint(fabsf(v[h])));
        codes[h].v[k] = code_ahead(v[h], scale, format);
        tiles[h][lane * kFp8Vec + k][i] = codes[h].v[k];
      }
    }
    if (q != nullptr)
      for (int h = 0; h < 2; ++h) *reinterpret_cast<Pack<uint8_t, kFp8Vec>*>(q + r * 2 * F + h * F + c) = codes[h];
  }
  fold.finish();
  if (q_t == nullptr) return;  // uniform over the grid
  __syncthreads();
  for (int h = 0; h < 2; ++h) store_tile_transposed(tiles[h], q_t, int64_t{h} * F, r0, c0, N, F);
}

template <typename T>
__global__ void __launch_bounds__(kBlock)
    swiglu_grad_fp8_kernel(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, const T* dout,
                           const T* gate_up, int64_t N, int F, float fp8_max, __nv_fp8_interpretation_t format,
                           const unsigned* amax) {
  const float scale = scale_ahead(*amax, fp8_max);
  if (blockIdx.x == 0 && threadIdx.x == 0) *inverse_scale = __fdiv_rn(1.0f, scale);
  MaximumFold fold{own};
  for (int64_t i = thread_index(); i < N * F; i += thread_count()) {
    const int64_t r = i / F, c = i - r * F;
    float v[2];
    stored_grads<T>(to_f32(gate_up[r * 2 * F + c]), to_f32(gate_up[r * 2 * F + F + c]), to_f32(dout[i]), v[0], v[1]);
    for (int h = 0; h < 2; ++h) {
      if (own != nullptr) fold.bits = max(fold.bits, __float_as_uint(fabsf(v[h])));
      const uint8_t code = code_ahead(v[h], scale, format);
      if (q != nullptr) q[r * 2 * F + h * F + c] = code;
      if (q_t != nullptr) q_t[(h * F + c) * N + r] = code;
    }
  }
  fold.finish();
}

}  // namespace

template <typename T>
void swiglu_backward_fp8(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, const T* dout, const T* gate_up,
                         int64_t N, int F, Fp8Format f, const unsigned* amax, const GpuContext& ctx) {
  ST_CHECK(N >= 0 && F >= 0, "gpu::swiglu_backward_fp8: ", N, " x ", F);
  const auto format = f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  if (N > 0 && F > 0 && N % kFp8Vec == 0 && F % kFp8Vec == 0 && all_aligned(kFp8Vec * sizeof(T), gate_up, dout) &&
      all_aligned(kFp8Vec, q, q_t)) {
    const dim3 grid(static_cast<unsigned>((N + kFp8Tile - 1) / kFp8Tile),
                    static_cast<unsigned>((F + kFp8Tile - 1) / kFp8Tile));
    swiglu_grad_fp8_tile_kernel<T>
        <<<grid, kBlock, 0, ctx.stream>>>(q, q_t, inverse_scale, own, dout, gate_up, N, F, fp8_max(f), format, amax);
  } else {  // any shape, and N or F 0 (the inverse scale alone)
    swiglu_grad_fp8_kernel<T><<<grid_for(std::max<int64_t>(N * F, 1), kBlock), kBlock, 0, ctx.stream>>>(
        q, q_t, inverse_scale, own, dout, gate_up, N, F, fp8_max(f), format, amax);
  }
  ST_CUDA_CHECK_LAUNCH();
}

template <typename T>
void swiglu_forward_fp8(uint8_t* q, uint8_t* q_t, float* inverse_scale, unsigned* own, const T* gate_up, int64_t N,
                        int F, Fp8Format f, const unsigned* amax, const GpuContext& ctx) {
  ST_CHECK(N >= 0 && F >= 0, "gpu::swiglu_forward_fp8: ", N, " x ", F);
  const auto format = f == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  if (N == 0 || F == 0) {
    swiglu_fp8_kernel<T><<<1, kBlock, 0, ctx.stream>>>(q, q_t, inverse_scale, own, gate_up, 0, 0, fp8_max(f), format,
                                                       amax);  // the inverse scale alone
  } else if (N % kFp8Vec == 0 && F % kFp8Vec == 0 && all_aligned(kFp8Vec * sizeof(T), gate_up) &&
             all_aligned(kFp8Vec, q, q_t)) {
    const dim3 grid(static_cast<unsigned>((N + kFp8Tile - 1) / kFp8Tile),
                    static_cast<unsigned>((F + kFp8Tile - 1) / kFp8Tile));
    swiglu_fp8_tile_kernel<T>
        <<<grid, kBlock, 0, ctx.stream>>>(q, q_t, inverse_scale, own, gate_up, N, F, fp8_max(f), format, amax);
  } else {
    swiglu_fp8_kernel<T><<<grid_for(N * F, kBlock), kBlock, 0, ctx.stream>>>(q, q_t, inverse_scale, own, gate_up, N, F,
                                                                             fp8_max(f), format, amax);
  }
  ST_CUDA_CHECK_LAUNCH();
}

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
template void swiglu_forward_fp8<float>(uint8_t*, uint8_t*, float*, unsigned*, const float*, int64_t, int, Fp8Format,
                                        const unsigned*, const GpuContext&);
template void swiglu_forward_fp8<bf16>(uint8_t*, uint8_t*, float*, unsigned*, const bf16*, int64_t, int, Fp8Format,
                                       const unsigned*, const GpuContext&);
template void swiglu_backward_fp8<float>(uint8_t*, uint8_t*, float*, unsigned*, const float*, const float*, int64_t,
                                         int, Fp8Format, const unsigned*, const GpuContext&);
template void swiglu_backward_fp8<bf16>(uint8_t*, uint8_t*, float*, unsigned*, const bf16*, const bf16*, int64_t, int,
                                        Fp8Format, const unsigned*, const GpuContext&);
template void swiglu_backward<float>(float*, const float*, const float*, int64_t, int, const GpuContext&, GradWrite,
                                     unsigned*);
template void swiglu_backward<bf16>(bf16*, const bf16*, const bf16*, int64_t, int, const GpuContext&, GradWrite,
                                    unsigned*);
template void swiglu_backward<fp16>(fp16*, const fp16*, const fp16*, int64_t, int, const GpuContext&, GradWrite,
                                    unsigned*);

}  // namespace st::gpu
