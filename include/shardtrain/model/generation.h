// Text generation with a decoder (decoder.h) and the sampling rule of sampling.h: prefill the prompt, then sample
// and step one token at a time. Past the cache's max_length() positions the context slides: the decoder is
// prefilled again with the last max_length() / 2 tokens (prompt and generated alike), so every token is conditioned
// on at least that many before it, and a re-read costs one prefill every max_length() / 2 tokens.
//
//   GenerationStats stats;
//   std::vector<int32_t> out = generate_tokens(*decoder, prompt, 100, {0.8, 40, seed}, &stats);
//   std::vector<std::vector<int32_t>> outs = generate_batch(*decoder, {prompt, other}, 100, {0.8, 40, seed});
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "shardtrain/model/decoder.h"
#include "shardtrain/model/sampling.h"

namespace st {

struct GenerationStats {
  // generate_batch sums the counts over its sequences and times the whole batch.
  int64_t prompt_tokens = 0;   // the prompt tokens prefilled (its last max_length() when it is longer)
  double prefill_seconds = 0;  // the prompt's prefill
  int64_t decode_steps = 0;    // forwards after the prompt's: one per generated token but the last
  double decode_seconds = 0;   // those forwards and every sampling, the slides' prefills included
  int64_t slides = 0;          // times the context slid (a prefill of the last max_length() / 2 tokens)
};

// Called with each token as soon as it is sampled (index i from 0), before the next forward; returns whether to go
// on. false ends the generation with that token, the last one returned (what a caller that streams its output does
// when the output is closed or a stop signal came).
using TokenSink = std::function<bool(int32_t token, int64_t i)>;

// n >= 0 tokens continuing `prompt` (at least one token; a prompt longer than max_length() keeps its last
// max_length() tokens), or fewer when `sink` stops it. Token i is sample_token(logits, options, i). The same decoder
// type, weights, prompt and options give the same tokens on every call.
std::vector<int32_t> generate_tokens(Decoder& decoder, const std::vector<int32_t>& prompt, int64_t n,
                                     const SamplingOptions& options, GenerationStats* stats = nullptr,
                                     const TokenSink& sink = nullptr);

// Called with token i of sequence `seq` (its index in `prompts`) as soon as it is sampled; returns whether that
// sequence goes on (false ends it with this token, the last one it gets). An exception thrown by the sink ends the
// whole batch at once (what a caller does on a stop signal or a closed output): it leaves generate_batch, with
// `stats` holding the work done until then, and no sequence is returned.
using BatchTokenSink = std::function<bool(int seq, int32_t token, int64_t i)>;

// Continues each of `prompts` (each at least one token) by n >= 0 tokens, or fewer where `sink` ends a sequence. The
// prompts go through the decoder max_batch() at a time, each group stepped together (Decoder::step_batch_next; a
// decoder of one sequence takes them one after another). Token i of every sequence is sample_token(logits, options, i),
// draw index i, whatever the other sequences are, and a sequence the sink ends leaves the others whole: on the CPU
// sequence s's tokens are exactly generate_tokens(decoder, prompts[s], n, options)'s; a GPU decoder's batched forward
// may round its products differently from one row's. The sink sees each sequence's tokens in order (i = 0, 1, ...); how
// the calls of different sequences interleave is the implementation's, the same on every call with the same decoder
// type, prompts and options (so ranks that decode the same batch call their sinks in the same order). `stats`:
// prompt_tokens, decode_steps and slides summed over the sequences, prefill_seconds the time of every prompt's prefill
// and decode_seconds of the rest. The decoder's cache is left holding an unspecified sequence.
std::vector<std::vector<int32_t>> generate_batch(Decoder& decoder, const std::vector<std::vector<int32_t>>& prompts,
                                                 int64_t n, const SamplingOptions& options,
                                                 GenerationStats* stats = nullptr,
                                                 const BatchTokenSink& sink = nullptr);

}  // namespace st
