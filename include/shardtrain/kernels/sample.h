// A sampled decoding step: each row's token drawn from softmax(logits / temperature) over its top_k most likely
// tokens. CPU reference; the CUDA version (kernels/gpu/sample.h) shares the signature and gives the same tokens, bit
// for bit, so that a decoder on either device draws the same token from the same logits.
//
//   SamplingOptions o{/*temperature=*/0.8, /*top_k=*/40, /*seed=*/7};
//   sample_rows(logits, padded_vocab, rows, vocab_size, draws, o, tokens);   // draws[r]: row r's draw index
//
// The draw is the Gumbel-max trick: token = the candidate i with the largest logit_i + temperature * g_i, where g_i is
// a standard Gumbel variable, a pure function of (seed, draw * V + i) (sample_noise). Its argmax is distributed as the
// softmax, needs no cumulative sum, and does not depend on the order in which the candidates are visited. The noise is
// computed in double from IEEE-exact operations alone (no libm log, whose last bits differ between host and device).
#pragma once

#include <cstdint>

namespace st {

// The RNG stream of sampling, apart from the initialisation streams (units.cc: one per unit index).
inline constexpr uint64_t kSampleStream = 0x5A3D1E;

struct SamplingOptions {
  double temperature = 1.0;  // >= 0 and finite; 0: greedy
  int64_t top_k = 0;         // >= 0; 0 or >= the vocabulary: every token
  uint64_t seed = 0;
};

// The noise of draw index `index`: g = -log(-log(u)), u = ((random_bits_at(seed, kSampleStream, index) >> 12) + 1/2)
// / 2^52 in (0, 1) (core/rng.h), with a log accurate to a few ulp; g lies in [-3.61, 36.74].
double sample_noise(uint64_t seed, uint64_t index);

// For each row r of logits [rows, ld] (the real vocabulary its first V columns): the candidates are the top_k ids by
// logit, ties to the lower id (every id when top_k is 0 or >= V), and tokens[r] is the candidate with the largest
// double(logit_i) + temperature * sample_noise(seed, draws[r] * V + i), ties to the lower id. -1 when the row holds a
// NaN or an infinity (the caller then reads the row and says where). temperature > 0 and finite, top_k >= 0 (greedy
// is argmax_rows, kernels/argmax.h; top_k 1 gives its token at any temperature).
void sample_rows(const float* logits, int64_t ld, int rows, int V, const uint64_t* draws, const SamplingOptions& o,
                 int32_t* tokens);

}  // namespace st
