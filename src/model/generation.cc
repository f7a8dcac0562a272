#include "shardtrain/model/generation.h"

#include <algorithm>
#include <chrono>

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

}  // namespace

std::vector<int32_t> generate_tokens(Decoder& decoder, const std::vector<int32_t>& prompt, int64_t n,
                                     const SamplingOptions& options, GenerationStats* stats, const TokenSink& sink) {
  if (prompt.empty()) ST_BAD_INPUT("generation needs a prompt of at least one token");
  ST_CHECK(n >= 0, "a generation of ", n, " tokens");
  check_sampling_options(options);
  GenerationStats s;
  std::vector<int32_t> out;
  if (n == 0) {
    if (stats != nullptr) *stats = s;
    return out;
  }
  const std::vector<int32_t> context = tail(prompt, {}, decoder.max_length());
  s.prompt_tokens = static_cast<int64_t>(context.size());
  auto t0 = std::chrono::steady_clock::now();
  const std::vector<float>* logits = &decoder.prefill(context);  // the decoder's own, valid until its next call
  s.prefill_seconds = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
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
      ++s.slides;
    } else if (greedy) {
      next = decoder.step_greedy(token);
    } else {
      logits = &decoder.step(token);
    }
    ++s.decode_steps;
  }
  s.decode_seconds = seconds_since(t0);
  if (stats != nullptr) *stats = s;
  return out;
}

}  // namespace st
