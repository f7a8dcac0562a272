// Causal multi-head self-attention on the GPU without the [B,NH,T,T] matrices (FlashAttention-2): the
// scores and probabilities live only in registers, one tile at a time, with an online (running max and sum)
// softmax in fp32. Memory is O(B*T*C); the backward pass recomputes the probabilities from the saved
// per-row logsumexp.
//
// Layouts as st::attention_* (kernels/attention.h), with grouped-query attention: qkv [B,T,(NH+2 NKV) hs], for
// each (b,t) the NH query heads, then the NKV key heads, then the NKV value heads, hs values each; query head h
// attends with K/V head h / (NH/NKV); out [B,T,NH hs] (heads concatenated); scores q.k / sqrt(hs), causal (query
// i sees keys 0..i). q/k/v are read, and out/dqkv written, in place in these layouts (no permuted copies). The
// (C, NH) forms are multi-head attention without grouping (GPT-2): NKV = NH, hs = C/NH, qkv [B,T,3C].
//
// T = bf16 or fp16 with hs in {16, 32, 64, 128} and 16-byte aligned pointers runs on tensor cores (mma.sync
// m16n8k16, fp32 accumulation; P and dS are rounded to T as the products' operands). Every other case
// (T = float, any other hs, misaligned pointers) runs a CUDA-core kernel in fp32 with the same results up to
// rounding. Both paths are deterministic: no atomics, fixed summation orders, so reruns are bit-identical.
// Device pointers, asynchronous on ctx.stream; ctx.blas is not used.
#pragma once

#include <cstddef>

#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st::gpu {

// Overwrites out [B,T,NH hs] and lse [B,NH,T] (fp32): lse[b,h,i] = log sum_{j<=i} exp(q_i.k_j / sqrt(hs)), the
// logsumexp of query row i's scaled, masked scores, which flash_attention_backward needs. No scratch. NH must be
// a positive multiple of NKV.
template <typename T>
void flash_attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int NH, int NKV, int hs,
                             const GpuContext& ctx);

// Accumulates dqkv [B,T,(NH+2 NKV) hs] += d(out)/d(qkv) applied to dout [B,T,NH hs] (dq, dk, dv into the q, k, v
// column blocks of each row), like st::attention_backward, from qkv and the forward's out and lse; a K/V head's
// gradient sums over the NH/NKV query heads that read it. dq and dk/dv are computed by separate kernels (one owns
// each query tile of a query head, the other each key tile of a K/V head and visits its query heads in order),
// so every element is summed in one fixed order and written once: reruns are bit-identical. Needs ctx.scratch of
// flash_attention_backward_scratch_bytes.
template <typename T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int T_,
                              int NH, int NKV, int hs, const GpuContext& ctx);

// Its scratch (scratch_sizes.h): D [B,NH,T] fp32, D[b,h,i] = sum_d dout[b,i,h*hs+d] * out[b,i,h*hs+d]
// (= sum_j P_ij dP_ij, the softmax backward's row term), rounded up to 256 bytes.

// Without grouping (GPT-2): NKV = NH heads of size hs = C/NH, qkv [B,T,3C], out [B,T,C].
template <typename T>
void flash_attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH, const GpuContext& ctx);
template <typename T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int T_,
                              int C, int NH, const GpuContext& ctx);

}  // namespace st::gpu
