// Fused softmax + cross-entropy over a padded vocabulary. CPU fp32 reference.
#pragma once

#include <cstdint>

namespace st {

// logits [N,Vp] with real vocabulary V <= Vp; columns [V,Vp) are padding and never enter the loss.
// losses[n] = logsumexp(logits[n,:V]) - logits[n,targets[n]], targets[n] in [0,V).
// If dlogits is non-null it receives dloss * (softmax(logits[n,:V]) - onehot(targets[n])) in [0,V) and 0
// in [V,Vp). dlogits may alias logits (in place), which is how the chunked classifier uses it.
// A target < 0 is not a target (a masked position, PyTorch's ignore_index): its loss is 0 and its dlogits row is 0
// in [0,Vp), whatever its logits hold.
void softmax_cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets, int64_t N, int V,
                           int Vp, float dloss);

}  // namespace st
