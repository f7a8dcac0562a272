// Token embedding, plus a learned position embedding (GPT-2) when wpe is given. CPU fp32 reference; a CUDA version
// shares the signature.
#pragma once

#include <cstdint>

namespace st {

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:].  out [B,T,C], tokens [B,T], wte [Vp,C], wpe [>=T,C] or null (no
// position embedding: out = wte[tokens]).
// Every token must be in [0, Vp); the data layer guarantees tokens < vocab_size.
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T, int C);
// embedding_forward of `rows` tokens, row r at position positions[r] (wpe's row; wpe may be null): what a decoding
// step reads from memory rather than from its launch. A negative position (an idle row) reads wpe's row 0.
void embedding_forward_at(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                          const int32_t* positions, int rows, int C);

// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += sum_b dout[b,t,:] (dwpe null: no position embedding).
// Deterministic: the sum order does not depend on the thread count.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T, int C);

}  // namespace st
