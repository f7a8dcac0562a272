// The low-rank update of a LoRA adapter on the GPU: the CUDA version of kernels/lora.h, same operands and meaning,
// through cuBLASLt (Blas::gemm: row-major with leading dimensions, products accumulated in fp32), for activations T
// in {float, bf16, fp16}. Device pointers, asynchronous on ctx.stream; needs ctx.blas, no scratch.
//
//   gpu::lora_forward<bf16>(qkv, QKV, GradWrite::kOverwrite, h, x, A_qkv, B_qkv, N, qkv_stack, scale, ctx);
//   gpu::matmul_forward_residual<bf16>(qkv, x, w_qkv, nullptr, qkv, N, C, QKV, ctx);   // the frozen base, added
//
// A stack's adapters share one GEMM for h = x A^T, one for dA and one for dx (the input read once, the input
// gradient written once); each has its own B GEMMs. Precision: h and dh are T, rounded once at their store; the
// forward's update and the backward's dB read that rounded h, so both use the same h. For T = float every product is
// an fp32 GEMM, as the CPU reference's.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/grad_write.h"
#include "shardtrain/kernels/lora.h"

namespace st::gpu {

// As st::lora_forward and st::lora_backward (kernels/lora.h), on device pointers.
template <typename T>
void lora_forward(T* out, int64_t ldo, GradWrite out_write, T* h, const T* x, const T* A, const T* B, int64_t N,
                  const LoraStack& s, float scale, const GpuContext& ctx);
template <typename T>
void lora_backward(T* dx, GradWrite dx_write, T* dA, T* dB, T* dh, const T* dout, int64_t ldo, const T* x, const T* h,
                   const T* A, const T* B, int64_t N, const LoraStack& s, float scale, const GpuContext& ctx,
                   GradWrite param_write = GradWrite::kAccumulate);

// As st::lora_dropout and st::lora_dropout_backward (kernels/lora.h): the same mask, element for element; T values
// are scaled in fp32 and rounded once at their store.
template <typename T>
void lora_dropout(T* out, const T* x, int64_t N, int in, const LoraDropoutKey& key, const GpuContext& ctx);
template <typename T>
void lora_dropout_backward(T* dx, T* dxd, const T* dh, const T* A, int64_t N, int in, int r, const LoraDropoutKey& key,
                           const GpuContext& ctx);

}  // namespace st::gpu
