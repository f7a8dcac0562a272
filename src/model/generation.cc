#include "shardtrain/model/generation.h"

#include <algorithm>
#include <chrono>
#include <limits>

#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

// The last `keep` tokens of a + b.
std::vector<int32_t> tail(const std::vector<int32_t>& a, const std::vector<int32_t>& b, int64_t keep) {
  std::vector<int32_t> all = a;
  all.insert(all.end(), b.begin(), b.end());
  const auto from = static_cast<ptrdiff_t>(std::max<int64_t>(0, static_cast<int64_t>(all.size()) - keep));
  return std::vector<int32_t>(all.begin() + from, all.end());
}

// Adds the time from its construction to its destruction to *seconds: on a return or when the sink throws.
class AddElapsed {
 public:
  explicit AddElapsed(double* seconds) : seconds_(seconds), t0_(std::chrono::steady_clock::now()) {}
  ~AddElapsed() { *seconds_ += seconds_since(t0_); }
  AddElapsed(const AddElapsed&) = delete;
  AddElapsed& operator=(const AddElapsed&) = delete;

 private:
  double* seconds_;
  std::chrono::steady_clock::time_point t0_;
};

// generate_tokens' loop, adding its counts and times to *s as it goes, so that *s holds the work done when the sink
// throws. The prompt is not empty, n >= 1 and the options are checked.
std::vector<int32_t> continue_prompt(Decoder& decoder, const std::vector<int32_t>& prompt, int64_t n,
                                     const SamplingOptions& options, GenerationStats* s, const TokenSink& sink) {
  std::vector<int32_t> out;
  const std::vector<int32_t> context = tail(prompt, {}, decoder.max_length());
  s->prompt_tokens += static_cast<int64_t>(context.size());
  const std::vector<float>* logits = nullptr;  // the decoder's own, valid until its next call
  {
    const AddElapsed timer(&s->prefill_seconds);
    logits = &decoder.prefill(context);
  }
  const AddElapsed timer(&s->decode_seconds);
  const int64_t keep = std::max<int64_t>(1, decoder.max_length() / 2);
  // Greedy decoding picks each next token inside the decoder (on the device for a GPU one): the same tokens.
  const bool greedy = options.temperature == 0 || options.top_k == 1;
  int32_t next = -1;  // the greedy token after the last step, when greedy
  for (int64_t i = 0; i < n; ++i) {
    const int32_t token = next >= 0 ? next : sample_token(*logits, options, static_cast<uint64_t>(i));
    next = -1;
    out.push_back(token);
    const bool more = !sink || sink(token, i);
    if (i + 1 == n || !more) break;
    if (decoder.full()) {
      logits = &decoder.prefill(tail(prompt, out, keep));
      ++s->slides;
    } else if (greedy) {
      next = decoder.step_greedy(token);
    } else {
      logits = &decoder.step(token);
    }
    ++s->decode_steps;
  }
  return out;
}

}  // namespace

std::vector<int32_t> generate_tokens(Decoder& decoder, const std::vector<int32_t>& prompt, int64_t n,
                                     const SamplingOptions& options, GenerationStats* stats, const TokenSink& sink) {
  if (prompt.empty()) ST_BAD_INPUT("generation needs a prompt of at least one token");
  ST_CHECK(n >= 0, "a generation of ", n, " tokens");
  check_sampling_options(options);
  GenerationStats s;
  std::vector<int32_t> out;
  if (n > 0) out = continue_prompt(decoder, prompt, n, options, &s, sink);
  if (stats != nullptr) *stats = s;
  return out;
}

std::vector<std::vector<int32_t>> generate_batch(Decoder& decoder, const std::vector<std::vector<int32_t>>& prompts,
                                                 int64_t n, const SamplingOptions& options, GenerationStats* stats,
                                                 const BatchTokenSink& sink) {
  // Every prompt is checked before the first is decoded, so a bad one ends the batch before any sink call.
  for (size_t s = 0; s < prompts.size(); ++s)
    if (prompts[s].empty()) ST_BAD_INPUT("generation needs prompts of at least one token; prompt ", s, " is empty");
  ST_CHECK(n >= 0, "a generation of ", n, " tokens");
  ST_CHECK(prompts.size() <= static_cast<size_t>(std::numeric_limits<int>::max()), "a batch of ", prompts.size(),
           " prompts");
  check_sampling_options(options);
  // One sequence after another through the single-sequence decoder: each is generate_tokens' own, the contract a
  // batched step keeps.
  GenerationStats total;
  std::vector<std::vector<int32_t>> out(prompts.size());
  try {
    for (size_t s = 0; s < prompts.size() && n > 0; ++s) {
      const int seq = static_cast<int>(s);
      TokenSink one;
      if (sink) one = [&sink, seq](int32_t token, int64_t i) { return sink(seq, token, i); };
      out[s] = continue_prompt(decoder, prompts[s], n, options, &total, one);
    }
  } catch (...) {
    if (stats != nullptr) *stats = total;
    throw;
  }
  if (stats != nullptr) *stats = total;
  return out;
}

}  // namespace st
