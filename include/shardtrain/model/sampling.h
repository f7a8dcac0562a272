// The next token from a decoder's logits: greedy (temperature 0), or a draw from softmax(logits / temperature)
// restricted to the top_k most likely tokens (0: every token), by the rule of kernels/sample.h (sample_rows, which a
// GPU decoder runs on the device and which gives the same token). Draw i of a generation reads the noise at (seed,
// kSampleStream, i * V + id) (core/rng.h): a pure function of the seed and the token's index, so the same seed gives
// the same tokens on every run and every rank, and the same logits the same token on either device.
//
//   SamplingOptions o{/*temperature=*/0.8, /*top_k=*/40, /*seed=*/7};
//   int32_t next = sample_token(decoder.step(prev), o, i);   // i: the index of the token being sampled
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/kernels/sample.h"  // SamplingOptions, kSampleStream

namespace st {

// kBadInput naming the field (temperature, top_k) and the value when it is out of range.
void check_sampling_options(const SamplingOptions& o);

// The id of the largest logit; ties go to the lowest id.
int32_t argmax_token(const std::vector<float>& logits);

// The token for logits over the real vocabulary (one per id). Greedy (argmax_token) when temperature is 0 or top_k is
// 1; otherwise sample_rows's token for the row with draw index `draw`: among the top_k ids by logit (ties to the lower
// id), the one with the largest logit + temperature * sample_noise(seed, draw * V + id), ties to the lower id, which
// is distributed as softmax(logits / temperature) over them. kBadInput when a logit is NaN or infinite (the weights
// hold one, or the compute type overflowed).
int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& o, uint64_t draw);

}  // namespace st
