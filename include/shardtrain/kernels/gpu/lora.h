// The low-rank update of a LoRA adapter on the GPU: the CUDA version of kernels/lora.h, same operands and meaning,
// through cuBLASLt (Blas::gemm: row-major with leading dimensions, products accumulated in fp32), for activations T
// in {float, bf16, fp16}. Device pointers, asynchronous on ctx.stream; needs ctx.blas, no scratch.
//
//   gpu::matmul_forward<bf16>(qkv, x, w_qkv, nullptr, N, C, QKV, ctx);                 // the frozen base
//   gpu::lora_forward<bf16>(qkv + k_row0, QKV, h_k, x, A_k, B_k, N, C, r, KV * D, scale, ctx);
//
// Precision: h and dh are T, rounded once at their store; the forward's update and the backward's dB read that
// rounded h, so both use the same h. For T = float every product is an fp32 GEMM, as the CPU reference's.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/grad_write.h"
#include "shardtrain/kernels/lora.h"

namespace st::gpu {

// h[N, r] = x[N, in] A[r, in]^T (kept for the backward), then out[n, 0..rows) += scale * (h B[rows, r]^T)[n, :], out
// with row pitch ldo >= rows.
template <typename T>
void lora_forward(T* out, int64_t ldo, T* h, const T* x, const T* A, const T* B, int64_t N, int in, int r, int rows,
                  float scale, const GpuContext& ctx);

// As st::lora_backward: dh [N, r] = scale * dout B (scratch, overwritten); dB [rows, r] += scale * dout^T h;
// dA [r, in] += dh^T x; dx [N, in] += dh A (dx may be null). With param_write = kOverwrite, dA and dB are written
// instead (not read; zero when N = 0); dx still accumulates.
template <typename T>
void lora_backward(T* dx, T* dA, T* dB, T* dh, const T* dout, int64_t ldo, const T* x, const T* h, const T* A,
                   const T* B, int64_t N, int in, int r, int rows, float scale, const GpuContext& ctx,
                   GradWrite param_write = GradWrite::kAccumulate);

// As st::lora_dropout and st::lora_dropout_backward (kernels/lora.h): the same mask, element for element; T values
// are scaled in fp32 and rounded once at their store.
template <typename T>
void lora_dropout(T* out, const T* x, int64_t N, int in, const LoraDropoutKey& key, const GpuContext& ctx);
template <typename T>
void lora_dropout_backward(T* dx, T* dxd, const T* dh, const T* A, int64_t N, int in, int r, const LoraDropoutKey& key,
                           const GpuContext& ctx);

}  // namespace st::gpu
