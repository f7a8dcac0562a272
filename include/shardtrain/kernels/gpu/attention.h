// Causal multi-head self-attention on the GPU: the st::attention_* contract (kernels/attention.h) on device
// pointers, through cuBLASLt strided-batched GEMMs (ctx.blas) and fp32 softmax kernels.
//
// Layouts as the CPU reference: qkv [B,T,3C] (q, k, v of each token; head h owns columns [h*hs, (h+1)*hs),
// hs = C/NH), out [B,T,C], att [B,NH,T,T] = the causal softmax probabilities, 0 above the diagonal.
// Scores are computed in full T x T (the masked half is computed and discarded) and, for T = bf16 or fp16,
// stored in T in att before the fp32 softmax reads them back (GEMMs accumulate in fp32).
#pragma once

#include <cstddef>

#include "shardtrain/kernels/gpu/context.h"

namespace st::gpu {

// Overwrites out and att. Needs ctx.blas and ctx.scratch of attention_forward_scratch_bytes<T>(B, T_, C, NH).
template <typename T>
void attention_forward(T* out, T* att, const T* qkv, int B, int T_, int C, int NH, const GpuContext& ctx);

// Accumulates dqkv [B,T,3C] += d(out)/d(qkv) applied to dout [B,T,C], from the saved att. Needs ctx.blas
// and ctx.scratch of attention_backward_scratch_bytes<T>(B, T_, C, NH).
template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, int B, int T_, int C, int NH,
                        const GpuContext& ctx);

// Scratch of attention_forward: q, k, v permuted to [B,NH,T,hs] (3 regions of B*T*C elements of T, each
// rounded up to 256 bytes); the q region then receives att @ v before it is unpermuted into out.
template <typename T>
size_t attention_forward_scratch_bytes(int B, int T_, int C, int NH);

// Scratch of attention_backward: six [B,NH,T,hs] regions of T (q, k, v; dout permuted, whose region then
// receives dq; dk; dv) and one [B,NH,T,T] region of T (dP = dout v^T, turned into dS = softmax backward in
// place); each region rounded up to 256 bytes.
template <typename T>
size_t attention_backward_scratch_bytes(int B, int T_, int C, int NH);

}  // namespace st::gpu
