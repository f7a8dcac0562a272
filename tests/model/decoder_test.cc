// The CPU decoders with a key/value cache (GptDecoder, LlamaDecoder) against the full forward (UnitModel's
// head_logits on the whole prefix), for a tiny gpt2 and a tiny llama with grouped-query attention, q/k/v biases,
// llama3 RoPE scaling and an untied head; greedy generation against the argmax of full recomputes, the sliding
// context, seeded sampling, and the full cache.
#include "shardtrain/model/decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <vector>

#include "../common/caught.h"
#include "../kernels/grad_check.h"
#include "../shard/plan_test_shapes.h"
#include "decoder_test_util.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/model/family.h"
#include "shardtrain/model/generation.h"
#include "shardtrain/model/sampling.h"
#include "shardtrain/model/units.h"

namespace st {
namespace {

using testing::random_weights;
using testing::tiny_gpt2;
using testing::tiny_llama;

// The full forward's logits after tokens[0, len): every position recomputed.
std::vector<float> full_logits(UnitModel& m, const std::vector<std::vector<float>>& w,
                               const std::vector<int32_t>& tokens, size_t len) {
  const int L = m.config().n_layer;
  m.embedding_forward(w[0].data(), tokens.data(), 1, static_cast<int64_t>(len));
  for (int l = 0; l < L; ++l) m.block_forward(l, w[static_cast<size_t>(1 + l)].data());
  std::vector<float> logits;
  m.head_logits(w.back().data(), w[0].data(), static_cast<int64_t>(len) - 1, &logits);
  return logits;
}

// max |got - want| / max |want| (grad_check.h), for logits of the vocabulary's size.
double rel_max_error(const std::vector<float>& got, const std::vector<float>& want) {
  return got.size() == want.size() ? testing::max_rel_diff(got, testing::to_double(want)) : INFINITY;
}

// Greedy tokens by full recomputes, sliding as generate_tokens does: the context is the last tokens since the start of
// the window, and when it would pass seq_len the window restarts at the last seq_len / 2 tokens.
std::vector<int32_t> greedy_by_recompute(UnitModel& m, const std::vector<std::vector<float>>& w,
                                         const std::vector<int32_t>& prompt, int64_t n) {
  const auto T = static_cast<size_t>(m.config().seq_len);
  std::vector<int32_t> seq = prompt, out;
  size_t start = 0;
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int32_t> context(seq.begin() + static_cast<ptrdiff_t>(start), seq.end());
    const int32_t t = argmax_token(full_logits(m, w, context, context.size()));
    out.push_back(t);
    seq.push_back(t);
    if (seq.size() - start > T) start = seq.size() - T / 2;
  }
  return out;
}

class DecoderFamily : public ::testing::TestWithParam<ModelArch> {
 protected:
  ModelConfig config() const { return GetParam() == ModelArch::kLlama ? tiny_llama() : tiny_gpt2(); }
};
INSTANTIATE_TEST_SUITE_P(Families, DecoderFamily, ::testing::Values(ModelArch::kGpt2, ModelArch::kLlama),
                         [](const auto& info) { return std::string(to_string(info.param)); });

const std::vector<int32_t> kPrompt = {17, 250, 3, 3, 99};

// After the prompt's prefill and after each step, the decoder's logits are the full forward's at the last position.
TEST_P(DecoderFamily, LogitsEqualTheFullForwardAtEveryStep) {
  const ModelConfig c = config();
  const std::vector<std::vector<float>> w = random_weights(c, 5);
  const std::unique_ptr<UnitModel> full = model_family(c.arch).make_cpu_model(c, 1, false);
  const std::unique_ptr<Decoder> d = load_decoder(model_family(c.arch).make_cpu_decoder(c, 1, {}), w);
  std::vector<int32_t> seq = kPrompt;
  std::vector<float> got = d->prefill(seq);
  ASSERT_EQ(got.size(), static_cast<size_t>(c.vocab_size));
  EXPECT_EQ(d->position(), 5);
  EXPECT_LE(rel_max_error(got, full_logits(*full, w, seq, seq.size())), 1e-5);
  for (int32_t t : {0, 299, 42, 42, 7, 123, 250, 1, 64, 200, 5, 9, 180, 77, 2}) {  // to the last position
    seq.push_back(t);
    got = d->step(t);
    SCOPED_TRACE(::testing::Message() << "position " << seq.size() - 1);
    EXPECT_EQ(d->position(), static_cast<int64_t>(seq.size()));
    EXPECT_LE(rel_max_error(got, full_logits(*full, w, seq, seq.size())), 1e-5);
  }
  EXPECT_TRUE(d->full());
  // A second prefill starts over: the same logits as the first time.
  EXPECT_LE(rel_max_error(d->prefill(kPrompt), full_logits(*full, w, kPrompt, kPrompt.size())), 1e-5);
  EXPECT_EQ(d->position(), 5);
}

// A step on a full cache is refused, naming the cache's size; the decoder is still usable after a prefill.
TEST_P(DecoderFamily, StepOnAFullCacheIsRefused) {
  const ModelConfig c = config();
  const std::unique_ptr<Decoder> d =
      load_decoder(model_family(c.arch).make_cpu_decoder(c, 1, {}), random_weights(c, 6));
  d->prefill(std::vector<int32_t>(static_cast<size_t>(c.seq_len), 4));
  ASSERT_TRUE(d->full());
  try {
    d->step(4);
    FAIL() << "a step on a full cache";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("full"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("20 positions"), std::string::npos) << e.what();
  }
  EXPECT_EQ(d->position(), c.seq_len);
  EXPECT_THROW(d->prefill(std::vector<int32_t>(static_cast<size_t>(c.seq_len) + 1, 4)), Error);
  EXPECT_THROW(d->prefill({}), Error);
  EXPECT_THROW(d->prefill({1, 300}), Error);  // outside the vocabulary (its padding rows included)
  d->prefill({1, 2});
  EXPECT_THROW(d->step(-1), Error);
  EXPECT_EQ(d->position(), 2);
  EXPECT_EQ(d->step(3).size(), static_cast<size_t>(c.vocab_size));
}

// Greedy generation equals the argmax of full recomputes, within the window and across two slides of the context.
TEST_P(DecoderFamily, GreedyTokensEqualTheArgmaxOfFullRecomputes) {
  const ModelConfig c = config();
  const std::vector<std::vector<float>> w = random_weights(c, 7);
  const std::unique_ptr<UnitModel> full = model_family(c.arch).make_cpu_model(c, 1, false);
  const std::unique_ptr<Decoder> d = load_decoder(model_family(c.arch).make_cpu_decoder(c, 1, {}), w);
  SamplingOptions greedy;
  greedy.temperature = 0;
  GenerationStats stats;
  const std::vector<int32_t> got = generate_tokens(*d, kPrompt, 40, greedy, &stats);
  EXPECT_EQ(got, greedy_by_recompute(*full, w, kPrompt, 40));
  // The prompt and 15 tokens fill the cache's 20 positions; each slide keeps 10, and 10 more fill it again.
  EXPECT_EQ(stats.slides, 3);
  EXPECT_EQ(stats.prompt_tokens, 5);
  EXPECT_EQ(stats.decode_steps, 39);
  // The tokens are not all one: the test compares a real sequence.
  EXPECT_GT(std::set<int32_t>(got.begin(), got.end()).size(), 3u);
}

// A step's token (step_batch_next of one sequence) is sample_token of step's logits with the step's draw index,
// greedy and sampled, step after step (a GPU decoder replays it as a graph: its own test compares it with the same
// step on the host), and moves the position as step does.
TEST_P(DecoderFamily, AStepsTokenIsSampleTokenOfAStep) {
  const ModelConfig c = config();
  const std::vector<std::vector<float>> w = random_weights(c, 12);
  const std::unique_ptr<Decoder> a = load_decoder(model_family(c.arch).make_cpu_decoder(c, 1, {}), w);
  const std::unique_ptr<Decoder> b = load_decoder(model_family(c.arch).make_cpu_decoder(c, 1, {}), w);
  for (const SamplingOptions& o :
       {SamplingOptions{0.0, 0, 0}, SamplingOptions{1.3, 0, 5}, SamplingOptions{0.8, 4, 6}}) {
    int32_t token = sample_token(a->prefill(kPrompt), o, 0);
    b->prefill(kPrompt);
    for (uint64_t i = 1; i <= 10; ++i) {
      const int32_t next = b->step_batch_next({token}, o, {i})[0];
      token = sample_token(a->step(token), o, i);
      EXPECT_EQ(next, token) << "temperature " << o.temperature << ", step " << i;
      EXPECT_EQ(b->position(), a->position());
    }
  }
}

// The sink sees every token as it is sampled, in order, and stops the generation after the token it returns false on.
TEST_P(DecoderFamily, TheSinkSeesEachTokenAndStopsTheGeneration) {
  const std::unique_ptr<Decoder> d =
      load_decoder(model_family(config().arch).make_cpu_decoder(config(), 1, {}), random_weights(config(), 9));
  const SamplingOptions o{1.0, 0, 3};  // temperature 1, every token, seed 3
  const std::vector<int32_t> all = generate_tokens(*d, kPrompt, 30, o);
  std::vector<int32_t> seen;
  const auto see = [&](int32_t t, int64_t i) {
    EXPECT_EQ(i, static_cast<int64_t>(seen.size()));
    seen.push_back(t);
    return true;
  };
  EXPECT_EQ(generate_tokens(*d, kPrompt, 30, o, nullptr, see), all);
  EXPECT_EQ(seen, all);
  GenerationStats stats;
  const std::vector<int32_t> first =
      generate_tokens(*d, kPrompt, 30, o, &stats, [](int32_t, int64_t i) { return i + 1 < 7; });
  EXPECT_EQ(first, std::vector<int32_t>(all.begin(), all.begin() + 7));
  EXPECT_EQ(stats.decode_steps, 6);  // no forward after the last token
}

// Sampling: the same seed twice gives the same tokens, another seed others; top_k = 1 is greedy at any temperature.
TEST_P(DecoderFamily, SampledTokensDependOnlyOnTheSeed) {
  const ModelConfig c = config();
  const std::vector<std::vector<float>> w = random_weights(c, 8);
  const std::unique_ptr<Decoder> d = load_decoder(model_family(c.arch).make_cpu_decoder(c, 1, {}), w);
  SamplingOptions o;
  o.temperature = 1.5;
  o.seed = 11;
  const std::vector<int32_t> a = generate_tokens(*d, kPrompt, 30, o);
  const std::vector<int32_t> b =
      generate_tokens(*load_decoder(model_family(c.arch).make_cpu_decoder(c, 1, {}), w), kPrompt, 30, o);
  EXPECT_EQ(a, b);
  o.seed = 12;
  const std::vector<int32_t> other = generate_tokens(*d, kPrompt, 30, o);
  EXPECT_NE(a, other);
  o.top_k = 1;
  SamplingOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(generate_tokens(*d, kPrompt, 30, o), generate_tokens(*d, kPrompt, 30, greedy));
  // top_k = 3 samples only among each step's 3 most likely tokens.
  o.top_k = 3;
  o.temperature = 5.0;
  std::vector<int32_t> seq = kPrompt;
  const std::vector<int32_t> topk = generate_tokens(*d, kPrompt, 14, o);  // within the window: no slide
  const std::unique_ptr<UnitModel> full = model_family(c.arch).make_cpu_model(c, 1, false);
  for (int32_t t : topk) {
    std::vector<float> logits = full_logits(*full, w, seq, seq.size());
    const float picked = logits[static_cast<size_t>(t)];
    std::sort(logits.begin(), logits.end(), std::greater<float>());
    EXPECT_GE(picked, logits[2]) << "token " << t;
    seq.push_back(t);
  }
}

TEST(Decoder, WeightsOfTheWrongShapeAreRefused) {
  const ModelConfig c = tiny_gpt2();
  std::vector<std::vector<float>> w = random_weights(c, 1);
  w.pop_back();
  EXPECT_THROW(load_decoder(model_family(c.arch).make_cpu_decoder(c, 1, {}), w), Error);
  w = random_weights(c, 1);
  w[1].pop_back();
  try {
    load_decoder(model_family(c.arch).make_cpu_decoder(c, 1, {}), w);
    FAIL() << "a short block";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("block.0"), std::string::npos) << e.what();
  }
}

// Units loaded one at a time, in any order, give the decoder that all of them at once give; a unit given twice is
// refused by name, and a decoder missing one refuses to run.
TEST(Decoder, UnitsLoadOneAtATimeInAnyOrder) {
  const ModelConfig c = tiny_llama();
  const std::vector<std::vector<float>> w = random_weights(c, 4);
  const std::vector<float> want = load_decoder(model_family(c.arch).make_cpu_decoder(c, 1, {}), w)->prefill(kPrompt);
  std::unique_ptr<Decoder> d = model_family(c.arch).make_cpu_decoder(c, 1, {});
  for (int u = static_cast<int>(w.size()) - 1; u >= 1; --u) {
    std::vector<float> values = w[static_cast<size_t>(u)];
    d->load_unit(u, values);
  }
  EXPECT_FALSE(d->loaded());
  EXPECT_THROW(d->prefill(kPrompt), Error);
  std::vector<float> again = w[1];
  try {
    d->load_unit(1, again);
    FAIL() << "a unit loaded twice";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("unit block.0's weights were given to the decoder twice"), std::string::npos)
        << e.what();
  }
  std::vector<float> first = w[0];
  d->load_unit(0, first);
  ASSERT_TRUE(d->loaded());
  EXPECT_EQ(d->prefill(kPrompt), want);
}

// Units given in a 16-bit type: a CPU decoder keeps none (half_kind kNone) and widens them exactly, so it decodes as
// one given the same values in fp32; the checks are load_unit's, and a kind that is not 16-bit is refused.
TEST(Decoder, UnitsInSixteenBitsAreWidenedByACpuDecoder) {
  const ModelConfig c = tiny_llama();
  std::vector<std::vector<float>> w = random_weights(c, 5);
  for (const HalfKind kind : {HalfKind::kBF16, HalfKind::kF16}) {
    std::vector<std::vector<uint16_t>> half(w.size());
    std::vector<std::vector<float>> wide(w.size());
    for (size_t u = 0; u < w.size(); ++u) {
      half[u].resize(w[u].size());
      round_to_half(w[u].data(), static_cast<int64_t>(w[u].size()), kind, half[u].data());
      wide[u].resize(w[u].size());
      for (size_t i = 0; i < w[u].size(); ++i)
        wide[u][i] = kind == HalfKind::kBF16 ? bf16_to_float(half[u][i]) : f16_to_float(half[u][i]);
    }
    const std::vector<float> want =
        load_decoder(model_family(c.arch).make_cpu_decoder(c, 1, {}), wide)->prefill(kPrompt);
    std::unique_ptr<Decoder> d = model_family(c.arch).make_cpu_decoder(c, 1, {});
    EXPECT_EQ(d->half_kind(), HalfKind::kNone);
    for (size_t u = 0; u < half.size(); ++u) d->load_unit_half(static_cast<int>(u), half[u], kind);
    ASSERT_TRUE(d->loaded());
    EXPECT_EQ(d->prefill(kPrompt), want);
    std::unique_ptr<Decoder> e = model_family(c.arch).make_cpu_decoder(c, 1, {});
    std::vector<uint16_t> short_block = half[1];
    short_block.pop_back();
    const Error size = testing::caught([&] { e->load_unit_half(1, short_block, kind); });
    EXPECT_NE(std::string(size.what()).find("unit block.0 has"), std::string::npos) << size.what();
    e->load_unit_half(1, half[1], kind);
    const Error twice = testing::caught([&] { e->load_unit_half(1, half[1], kind); });
    EXPECT_NE(std::string(twice.what()).find("unit block.0's weights were given to the decoder twice"),
              std::string::npos)
        << twice.what();
    EXPECT_THROW(e->load_unit_half(0, half[0], HalfKind::kNone), Error);
  }
}

// Llama-3.2-1B in bf16: the weights are every unit's elements at 2 bytes; the caches 2 (keys, values) x 16 layers x
// sequences x 2048 positions x 8 key/value heads of 64 at 2 bytes, 64 MiB a sequence.
TEST(DecoderFootprint, WeightsAndCachesAreTheirElementsInTheComputeType) {
  const ModelConfig m = plan_test::llama_1b().model;
  const DecoderFootprint one = decoder_footprint(m, DType::kBF16, 1);
  EXPECT_EQ(one.weights, 2 * count_params(build_units(m)));
  EXPECT_EQ(one.cache, int64_t{64} << 20);
  EXPECT_EQ(decoder_footprint(m, DType::kBF16, 16).cache, int64_t{1} << 30);
  EXPECT_EQ(decoder_footprint(m, DType::kF32, 1).weights, 4 * count_params(build_units(m)));
  EXPECT_GT(one.activations, 0);
  EXPECT_EQ(one.total(), one.weights + one.cache + one.activations + one.runtime);
  EXPECT_NE(decoder_footprint(m, DType::kBF16, 64).breakdown().find("key/value caches 4.00 GiB"), std::string::npos);
}

}  // namespace
}  // namespace st
