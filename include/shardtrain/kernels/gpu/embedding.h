// Token embedding, plus a learned position embedding (GPT-2) when wpe is given, on the GPU: the CUDA version of
// kernels/embedding.h, same operands and meaning, for activations T in {float, bf16, fp16} (fp32 arithmetic, T only
// for storage). Device pointers, asynchronous on ctx.stream.
#pragma once

#include <cstddef>
#include <cstdint>

#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st::gpu {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].  out [B,T_,C], tokens [B,T_], wte [Vp,C], wpe [>=T_,C] or null (no
// position embedding, as llama: out = wte[tokens]). Every token must be in [0, Vp) (not checked on the device).
template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int T_, int C,
                       const GpuContext& ctx);

// As st::embedding_forward_at: `rows` tokens, row r at position positions[r] (device memory; read only with wpe).
template <typename T>
void embedding_forward_at(T* out, const int32_t* tokens, const T* wte, const T* wpe, const int32_t* positions, int rows,
                          int C, const GpuContext& ctx);

// Accumulates: dwte[v,:] += sum over positions (b,t) with tokens[b,t] == v of dout[b,t,:], and
// dwpe[t,:] += sum_b dout[b,t,:] (dwpe null: no position embedding, nothing added). Each sum is formed in fp32 in
// (b,t) order and added to the output once, so the result is bit-identical run to run (no atomics). Rows of dwte
// whose token does not occur are not touched. Needs embedding_backward_scratch_bytes(B, T_, C) bytes of ctx.scratch.
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int T_, int C,
                        const GpuContext& ctx);

// What CUB's radix sort in embedding_backward asks for at B*T items (a run-time query, so it needs a CUDA device);
// the scratch embedding_backward_scratch_bytes gives it is cub_sort_pairs_temp_bound(B*T) (scratch_sizes.h), and
// embedding_backward refuses to run if CUB asks for more.
size_t embedding_sort_temp_bytes(int64_t BT);

}  // namespace st::gpu
