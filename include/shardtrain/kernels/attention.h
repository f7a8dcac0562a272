// Causal multi-head self-attention on a fused QKV activation, with grouped-query attention (fewer K/V heads than
// query heads). CPU fp32 reference.
#pragma once

#include <cstdint>

namespace st {

// qkv [B,T,(NH+2 NKV) hs]: for each (b,t) the NH heads of q, then the NKV heads of k, then the NKV heads of v, hs
// values each. Query head h attends with K/V head h / (NH/NKV). out [B,T,NH hs] (heads concatenated), att
// [B,NH,T,T]: the softmax probabilities of softmax(q k^T / sqrt(hs)) with the causal mask; entries with key index >
// query index are written 0. NH must be a multiple of NKV.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int NKV, int hs);

// Accumulates dqkv += d(out)/d(qkv) applied to dout, using the saved att. A K/V head's gradient sums over its
// query heads.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int NH,
                        int NKV, int hs);

// Multi-head attention without grouping (GPT-2): qkv [B,T,3C], hs = C/NH; C must be a multiple of NH.
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH);
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                        int NH);

}  // namespace st
