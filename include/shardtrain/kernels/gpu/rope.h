// RoPE on the GPU: the CUDA version of kernels/rope.h, same operands and meaning, for activations T in {float, bf16,
// fp16} (fp32 arithmetic). cos and sin are the fp32 tables of st::rope_table ([T, hs/2]), in device memory. Device
// pointers, asynchronous on ctx.stream; no scratch.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/rope.h"

namespace st::gpu {

// Rotates the NH query heads and NKV key heads of qkv [B,T,(NH+2 NKV) hs] in place (rotate-half layout).
template <typename T>
void rope_forward(T* qkv, const float* cos, const float* sin, int64_t B, int64_t T_, int NH, int NKV, int hs,
                  const GpuContext& ctx);

// As st::rope_forward_at: row r of qkv [rows, (NH+2 NKV) hs] at position positions[r] (device memory).
template <typename T>
void rope_forward_at(T* qkv, const float* cos, const float* sin, const int32_t* positions, int64_t rows, int NH,
                     int NKV, int hs, const GpuContext& ctx);

// The transpose rotation on the gradient, in place on dqkv. amax (device, optional) gets the maximum of the whole of
// dqkv after it folded in, as kernels/rope.h says: the rotated heads' values as stored in T, and the value heads' as
// read; the bits gpu::fp8_maxima_async (kernels/gpu/fp8.h) takes of dqkv, non-finite values included, one atomicMax a
// block. The caller zeroes it first.
template <typename T>
void rope_backward(T* dqkv, const float* cos, const float* sin, int64_t B, int64_t T_, int NH, int NKV, int hs,
                   const GpuContext& ctx, unsigned* amax = nullptr);

}  // namespace st::gpu
