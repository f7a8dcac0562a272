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

// The loop of generate_tokens and generate_batch: prompts [first, first + count) in decoder sequences 0 .. count - 1,
// stepped together, adding counts and times to *s as it goes (so that *s holds the work done when the sink throws).
// Each round, every live sequence's pending token (sampled, handed to the sink, not yet run) is run: in the batched
// step, which draws each row's next token too (Decoder::step_batch_next: on a GPU, on the device), or, for a sequence
// whose cache is full, by a prefill of its last max_length() / 2 tokens (the slide), its next token drawn here.
// Finished sequences sit the steps out (Decoder::kIdle). The prompts are not empty, n >= 1, the options checked.
void continue_together(Decoder& decoder, const std::vector<std::vector<int32_t>>& prompts, size_t first, size_t count,
                       int64_t n, const SamplingOptions& options, GenerationStats* s, const BatchTokenSink& sink,
                       std::vector<std::vector<int32_t>>* out) {
  const int64_t keep = std::max<int64_t>(1, decoder.max_length() / 2);
  std::vector<int32_t> pending(count, Decoder::kIdle);  // kIdle: finished
  std::vector<int64_t> index(count, 0);                 // the index of each sequence's next token
  // Hands token `t` of sequence j to the sink; whether the sequence goes on.
  auto emit = [&](size_t j, int32_t t) {
    std::vector<int32_t>& o = (*out)[first + j];
    o.push_back(t);
    const int64_t i = index[j]++;
    const bool more = !sink || sink(static_cast<int>(first + j), t, i);
    pending[j] = more && i + 1 < n ? t : Decoder::kIdle;
  };
  for (size_t j = 0; j < count; ++j) {
    const std::vector<int32_t> context = tail(prompts[first + j], {}, decoder.max_length());
    s->prompt_tokens += static_cast<int64_t>(context.size());
    const std::vector<float>* logits = nullptr;
    {
      const AddElapsed timer(&s->prefill_seconds);
      logits = &decoder.prefill(context, static_cast<int>(j));
    }
    const AddElapsed timer(&s->decode_seconds);
    emit(j, sample_token(*logits, options, 0));
  }
  const AddElapsed timer(&s->decode_seconds);
  for (;;) {
    std::vector<int32_t> step(count, Decoder::kIdle);
    std::vector<int32_t> slid(count, Decoder::kIdle);  // the token a slide's prefill gave
    bool any = false;
    for (size_t j = 0; j < count; ++j) {
      if (pending[j] == Decoder::kIdle) continue;
      any = true;
      if (!decoder.full(static_cast<int>(j))) {
        step[j] = pending[j];
        continue;
      }
      const std::vector<float>& logits =
          decoder.prefill(tail(prompts[first + j], (*out)[first + j], keep), static_cast<int>(j));
      slid[j] = sample_token(logits, options, static_cast<uint64_t>(index[j]));
      ++s->slides;
    }
    if (!any) return;
    std::vector<int32_t> next(count, Decoder::kIdle);
    if (std::any_of(step.begin(), step.end(), [](int32_t t) { return t != Decoder::kIdle; }))
      next = decoder.step_batch_next(step, options, std::vector<uint64_t>(index.begin(), index.end()));
    for (size_t j = 0; j < count; ++j) {
      if (pending[j] == Decoder::kIdle) continue;
      ++s->decode_steps;
      emit(j, step[j] != Decoder::kIdle ? next[j] : slid[j]);
    }
  }
}

}  // namespace

std::vector<int32_t> generate_tokens(Decoder& decoder, const std::vector<int32_t>& prompt, int64_t n,
                                     const SamplingOptions& options, GenerationStats* stats, const TokenSink& sink) {
  if (prompt.empty()) ST_BAD_INPUT("generation needs a prompt of at least one token");
  ST_CHECK(n >= 0, "a generation of ", n, " tokens");
  check_sampling_options(options);
  GenerationStats s;
  std::vector<std::vector<int32_t>> out(1);
  BatchTokenSink one;
  if (sink) one = [&sink](int, int32_t token, int64_t i) { return sink(token, i); };
  if (n > 0) continue_together(decoder, {prompt}, 0, 1, n, options, &s, one, &out);
  if (stats != nullptr) *stats = s;
  return out[0];
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
  GenerationStats total;
  std::vector<std::vector<int32_t>> out(prompts.size());
  try {
    const size_t group = static_cast<size_t>(decoder.max_batch());
    for (size_t first = 0; first < prompts.size() && n > 0; first += group) {
      const size_t count = std::min(group, prompts.size() - first);
      continue_together(decoder, prompts, first, count, n, options, &total, sink, &out);
    }
  } catch (...) {
    if (stats != nullptr) *stats = total;
    throw;
  }
  if (stats != nullptr) *stats = total;
  return out;
}

}  // namespace st
