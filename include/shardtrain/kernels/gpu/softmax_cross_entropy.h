// Fused softmax + cross-entropy over a padded vocabulary on the GPU: the CUDA version of
// kernels/softmax_cross_entropy.h, same operands and meaning, for logits T in {float, bf16, fp16} (fp32
// arithmetic; losses are fp32). Device pointers, asynchronous on ctx.stream; no scratch.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/gpu/context.h"

namespace st::gpu {

// logits [N,Vp] with real vocabulary 0 < V <= Vp; columns [V,Vp) are padding and never enter the loss.
// losses[n] = logsumexp(logits[n,:V]) - logits[n,targets[n]]. If dlogits is non-null it receives
// dloss * (softmax(logits[n,:V]) - onehot(targets[n])) in [0,V) and 0 in [V,Vp). dlogits may alias
// logits (in place). A target < 0 is not a target (a masked position): loss 0 and a dlogits row of 0 in [0,Vp),
// as on the CPU. targets[n] >= V is not checked on the host (device memory), but such a row gets a NaN loss
// instead of reading outside the row.
template <typename T>
void softmax_cross_entropy(float* losses, T* dlogits, const T* logits, const int32_t* targets, int64_t N, int V, int Vp,
                           float dloss, const GpuContext& ctx);

}  // namespace st::gpu
