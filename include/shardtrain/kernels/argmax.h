// The greedy choice of a decoding step: each row's largest logit over the real vocabulary. CPU reference; the CUDA
// version (kernels/gpu/argmax.h) shares the signature, and a decoder that keeps its logits on the device picks its
// greedy token there.
//
//   argmax_rows(logits, padded_vocab, rows, vocab_size, tokens);   // tokens[r]: -1 where row r holds a NaN or an inf
#pragma once

#include <cstdint>

namespace st {

// tokens[r] = the id of the largest of logits[r ld + 0 .. r ld + V - 1], ties to the lowest id (as argmax_token,
// model/sampling.h); -1 when the row holds a NaN or an infinity (the caller then reads the row and says where).
void argmax_rows(const float* logits, int64_t ld, int rows, int V, int32_t* tokens);

}  // namespace st
