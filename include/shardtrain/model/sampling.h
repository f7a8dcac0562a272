// The next token from a decoder's logits: greedy (temperature 0), or a draw from softmax(logits / temperature)
// restricted to the top_k most likely tokens (0: every token), in double on the host. Draw i of a generation is
// uniform_at(seed, kSampleStream, i) (core/rng.h): a pure function of the seed and the token's index, so the same
// seed gives the same tokens on every run and on every rank.
//
//   SamplingOptions o{/*temperature=*/0.8, /*top_k=*/40, /*seed=*/7};
//   int32_t next = sample_token(decoder.step(prev), o, i);   // i: the index of the token being sampled
#pragma once

#include <cstdint>
#include <vector>

namespace st {

// The RNG stream of sampling, apart from the initialisation streams (units.cc: one per unit index).
inline constexpr uint64_t kSampleStream = 0x5A3D1E;

struct SamplingOptions {
  double temperature = 1.0;  // >= 0 and finite; 0: greedy
  int64_t top_k = 0;         // >= 0; 0 or >= the vocabulary: every token
  uint64_t seed = 0;
};

// kBadInput naming the field (temperature, top_k) and the value when it is out of range.
void check_sampling_options(const SamplingOptions& o);

// The id of the largest logit; ties go to the lowest id.
int32_t argmax_token(const std::vector<float>& logits);

// The token for logits over the real vocabulary (one per id). Greedy (argmax_token) when temperature is 0 or top_k is
// 1; otherwise the candidates are the top_k ids by logit (ties to the lower id), p(id) is proportional to
// exp((logit - max) / temperature), and the token is the first candidate, in id order, at which the cumulative
// probability reaches u * total with u = uniform_at(seed, kSampleStream, draw). kBadInput when a logit is NaN or
// infinite (the weights hold one, or the compute type overflowed).
int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& o, uint64_t draw);

}  // namespace st
