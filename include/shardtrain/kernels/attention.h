// Causal multi-head self-attention on a fused QKV activation. CPU fp32 reference.
#pragma once

#include <cstdint>

namespace st {

// qkv [B,T,3C]: for each (b,t) the C values of q, then k, then v; head h owns columns [h*hs, (h+1)*hs)
// of each, hs = C/NH. out [B,T,C] (heads concatenated), att [B,NH,T,T]: the softmax probabilities of
// softmax(q k^T / sqrt(hs)) with the causal mask; entries with key index > query index are written 0.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);

// Accumulates dqkv [B,T,3C] += d(out)/d(qkv) applied to dout, using the saved att.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH);

}  // namespace st
