// Causal multi-head self-attention on the GPU without the [B,NH,T,T] matrices (FlashAttention-2): the
// scores and probabilities live only in registers, one tile at a time, with an online (running max and sum)
// softmax in fp32. Memory is O(B*T*C); the backward pass recomputes the probabilities from the saved
// per-row logsumexp.
//
// Layouts as st::attention_* (kernels/attention.h): qkv [B,T,3C], for each (b,t) the C values of q, then k,
// then v; head h owns columns [h*hs, (h+1)*hs) of each, hs = C/NH; out [B,T,C] (heads concatenated); scores
// q.k / sqrt(hs), causal (query i sees keys 0..i). q/k/v are read, and out/dqkv written, in place in these
// layouts (no permuted copies).
//
// T = bf16 or fp16 with hs in {16, 32, 64, 128} and 16-byte aligned pointers runs on tensor cores (mma.sync
// m16n8k16, fp32 accumulation; P and dS are rounded to T as the products' operands). Every other case
// (T = float, any other hs, misaligned pointers) runs a CUDA-core kernel in fp32 with the same results up to
// rounding. Both paths are deterministic: no atomics, fixed summation orders, so reruns are bit-identical.
// Device pointers, asynchronous on ctx.stream; ctx.blas is not used.
#pragma once

#include <cstddef>

#include "shardtrain/kernels/gpu/context.h"

namespace st::gpu {

// Overwrites out [B,T,C] and lse [B,NH,T] (fp32): lse[b,h,i] = log sum_{j<=i} exp(q_i.k_j / sqrt(hs)), the
// logsumexp of query row i's scaled, masked scores, which flash_attention_backward needs. No scratch.
template <typename T>
void flash_attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int C, int NH, const GpuContext& ctx);

// Accumulates dqkv [B,T,3C] += d(out)/d(qkv) applied to dout [B,T,C] (dq, dk, dv into the q, k, v column
// blocks of each row), like st::attention_backward, from qkv and the forward's out and lse. dq and dk/dv are
// computed by separate kernels (one owns each query tile, the other each key tile), so every element is
// summed in one fixed order and written once. Needs ctx.scratch of flash_attention_backward_scratch_bytes.
template <typename T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int T_,
                              int C, int NH, const GpuContext& ctx);

// Scratch of flash_attention_backward: D [B,NH,T] fp32, D[b,h,i] = sum_d dout[b,i,h*hs+d] * out[b,i,h*hs+d]
// (= sum_j P_ij dP_ij, the softmax backward's row term), rounded up to 256 bytes.
size_t flash_attention_backward_scratch_bytes(int B, int T_, int C, int NH);

// Grouped-query attention (NKV key/value heads shared by NH query heads, NH a multiple of NKV; hs per head):
// qkv [B,T,(NH+2 NKV) hs] (q heads, then k heads, then v heads per row, as st::attention_forward's GQA layout),
// query head h reads key/value head h / (NH / NKV). out [B,T,NH hs], lse [B,NH,T]. The backward ACCUMULATES into
// dqkv [B,T,(NH+2 NKV) hs]. NKV = NH, hs = C / NH is the multi-head attention above.
template <typename T>
void flash_attention_forward(T* out, float* lse, const T* qkv, int B, int T_, int NH, int NKV, int hs,
                             const GpuContext& ctx);
template <typename T>
void flash_attention_backward(T* dqkv, const T* dout, const T* qkv, const T* out, const float* lse, int B, int T_,
                              int NH, int NKV, int hs, const GpuContext& ctx);
size_t flash_attention_backward_scratch_bytes(int B, int T_, int NH, int NKV, int hs);

}  // namespace st::gpu
