// generate_batch against generate_tokens on the CPU decoders of a tiny gpt2 and a tiny llama: each sequence's tokens
// are its prompt's own, greedy and sampled, for prompts of different lengths (one that slides past the window); a
// sink that ends one sequence leaves the others whole; the stats sum over the sequences; an empty prompt is refused
// before any token and an exception from the sink ends the batch.
#include "shardtrain/model/generation.h"

#include <gtest/gtest.h>

#include <memory>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "decoder_test_util.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/family.h"
#include "shardtrain/model/sampling.h"

namespace st {
namespace {

using testing::random_weights;
using testing::tiny_gpt2;
using testing::tiny_llama;

// Lengths 1, 5, 12 and 20 (the whole window of tiny_*'s seq_len 20: the first step slides).
const std::vector<std::vector<int32_t>> kPrompts = {
    {7}, {72, 104, 101, 32, 113}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 299}, {20, 21, 22, 23, 24, 25, 26, 27, 28, 29,
                                                                             30, 31, 32, 33, 34, 35, 36, 37, 38, 39}};

// Each family with decoders of 1 sequence (the prompts one after another), 3 (a group of three stepped together, then
// one alone) and 8 (all four together).
class BatchFamily : public ::testing::TestWithParam<std::tuple<ModelArch, int>> {
 protected:
  ModelConfig config() const { return std::get<0>(GetParam()) == ModelArch::kLlama ? tiny_llama() : tiny_gpt2(); }
  std::unique_ptr<Decoder> decoder(uint64_t seed, int max_batch = 0) const {
    const int batch = max_batch > 0 ? max_batch : std::get<1>(GetParam());
    return load_decoder(model_family(config().arch).make_cpu_decoder(config(), batch, {}),
                        random_weights(config(), seed));
  }
};
INSTANTIATE_TEST_SUITE_P(Families, BatchFamily,
                         ::testing::Combine(::testing::Values(ModelArch::kGpt2, ModelArch::kLlama),
                                            ::testing::Values(1, 3, 8)),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_batch" +
                                  std::to_string(std::get<1>(info.param));
                         });

std::vector<SamplingOptions> samplings() {
  return {{0.0, 0, 0}, {1.0, 0, 3}, {0.9, 20, 7}};  // greedy; plain sampling; top-k
}

TEST_P(BatchFamily, EachSequenceIsItsPromptsOwnGeneration) {
  const std::unique_ptr<Decoder> d = decoder(5);
  for (const SamplingOptions& o : samplings()) {
    const std::vector<std::vector<int32_t>> got = generate_batch(*d, kPrompts, 30, o);
    ASSERT_EQ(got.size(), kPrompts.size());
    for (size_t s = 0; s < kPrompts.size(); ++s) {
      EXPECT_EQ(got[s], generate_tokens(*decoder(5, 1), kPrompts[s], 30, o))
          << "sequence " << s << ", temperature " << o.temperature << ", top_k " << o.top_k;
      EXPECT_EQ(got[s].size(), 30u);
    }
    // The sequences differ: the comparison is not of one sequence repeated.
    EXPECT_NE(got[0], got[1]);
  }
  // The same prompt twice in a batch gives the same tokens twice; a batch of one is generate_tokens.
  const SamplingOptions o{1.0, 0, 3};
  const std::vector<std::vector<int32_t>> twice = generate_batch(*d, {kPrompts[1], kPrompts[1]}, 12, o);
  EXPECT_EQ(twice[0], twice[1]);
  EXPECT_EQ(generate_batch(*d, {kPrompts[2]}, 12, o).at(0), generate_tokens(*d, kPrompts[2], 12, o));
}

TEST_P(BatchFamily, ASinkThatEndsOneSequenceLeavesTheOthersWhole) {
  const std::unique_ptr<Decoder> d = decoder(6);
  const SamplingOptions o{1.2, 0, 11};
  const std::vector<std::vector<int32_t>> whole = generate_batch(*d, kPrompts, 25, o);
  std::vector<std::vector<int32_t>> seen(kPrompts.size());
  const auto sink = [&](int seq, int32_t token, int64_t i) {
    std::vector<int32_t>& s = seen.at(static_cast<size_t>(seq));
    EXPECT_EQ(i, static_cast<int64_t>(s.size())) << "sequence " << seq;
    s.push_back(token);
    return !(seq == 1 && i == 4);  // sequence 1 ends with its token 4
  };
  GenerationStats stats;
  const std::vector<std::vector<int32_t>> got = generate_batch(*d, kPrompts, 25, o, &stats, sink);
  ASSERT_EQ(got.size(), kPrompts.size());
  EXPECT_EQ(got[1], std::vector<int32_t>(whole[1].begin(), whole[1].begin() + 5));
  for (size_t s : {0u, 2u, 3u}) EXPECT_EQ(got[s], whole[s]) << "sequence " << s;
  EXPECT_EQ(seen, got);
  // 24 forwards after each whole sequence's prefill, 4 after sequence 1's.
  EXPECT_EQ(stats.decode_steps, 3 * 24 + 4);
}

TEST_P(BatchFamily, StatsSumOverTheSequences) {
  const std::unique_ptr<Decoder> d = decoder(7);
  const SamplingOptions greedy{0.0, 0, 0};
  GenerationStats sum;
  for (const std::vector<int32_t>& p : kPrompts) {
    GenerationStats one;
    generate_tokens(*d, p, 30, greedy, &one);
    sum.prompt_tokens += one.prompt_tokens;
    sum.decode_steps += one.decode_steps;
    sum.slides += one.slides;
  }
  GenerationStats stats;
  generate_batch(*d, kPrompts, 30, greedy, &stats);
  EXPECT_EQ(stats.prompt_tokens, 1 + 5 + 12 + 20);
  EXPECT_EQ(stats.prompt_tokens, sum.prompt_tokens);
  EXPECT_EQ(stats.decode_steps, 4 * 29);
  EXPECT_EQ(stats.decode_steps, sum.decode_steps);
  // Slides (a cache of 20 positions; a slide keeps 10, and the last token needs no forward): prompt 1 slides after
  // token 19; prompt 5 after tokens 15 and 26; prompt 12 after 8 and 19; prompt 20 after 0, 11 and 22.
  EXPECT_EQ(stats.slides, 1 + 2 + 2 + 3);
  EXPECT_EQ(stats.slides, sum.slides);
  EXPECT_GT(stats.prefill_seconds, 0.0);
  EXPECT_GT(stats.decode_seconds, 0.0);
}

TEST_P(BatchFamily, NoTokensOrNoPromptsGiveEmptyResults) {
  const std::unique_ptr<Decoder> d = decoder(8);
  int calls = 0;
  const auto count = [&](int, int32_t, int64_t) { return ++calls > 0; };
  GenerationStats stats;
  const std::vector<std::vector<int32_t>> none = generate_batch(*d, kPrompts, 0, {}, &stats, count);
  EXPECT_EQ(none, std::vector<std::vector<int32_t>>(kPrompts.size()));
  EXPECT_EQ(stats.prompt_tokens, 0);
  EXPECT_EQ(generate_batch(*d, {}, 10, {}, &stats, count), std::vector<std::vector<int32_t>>{});
  EXPECT_EQ(stats.decode_steps, 0);
  EXPECT_EQ(calls, 0);
}

TEST_P(BatchFamily, AnEmptyPromptIsRefusedBeforeAnyToken) {
  const std::unique_ptr<Decoder> d = decoder(9);
  int calls = 0;
  try {
    generate_batch(*d, {kPrompts[1], {}}, 10, {}, nullptr, [&](int, int32_t, int64_t) { return ++calls > 0; });
    FAIL() << "an empty prompt was decoded";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("prompt 1 is empty"), std::string::npos) << e.what();
  }
  EXPECT_EQ(calls, 0);
}

TEST_P(BatchFamily, AnExceptionFromTheSinkEndsTheBatch) {
  const std::unique_ptr<Decoder> d = decoder(10);
  std::vector<std::pair<int, int64_t>> calls;
  const auto sink = [&](int seq, int32_t, int64_t i) {
    calls.emplace_back(seq, i);
    if (seq == 1 && i == 2) throw std::runtime_error("stop");
    return true;
  };
  GenerationStats stats;
  EXPECT_THROW(generate_batch(*d, kPrompts, 6, {}, &stats, sink), std::runtime_error);
  // The stats hold the work done: sequence 1's prompt at least was prefilled, and stepped twice before its token 2.
  EXPECT_GE(stats.prompt_tokens, 5);
  EXPECT_GE(stats.decode_steps, 2);
  // No call after the throwing one, and every sequence's calls in order up to there.
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back(), (std::pair<int, int64_t>{1, 2}));
  std::vector<int64_t> next(kPrompts.size(), 0);
  for (const auto& [seq, i] : calls) EXPECT_EQ(i, next.at(static_cast<size_t>(seq))++) << "sequence " << seq;
}

}  // namespace
}  // namespace st
