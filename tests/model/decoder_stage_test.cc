// The layer split of a decoder (decoder_stage.h): split_units' ranges cover the units once, in order, a block or more
// each, and their largest stage is the least of every split (against all splits of small models); a model with fewer
// blocks than ranks is refused; the units each stage holds. Then the split CPU decoders, their ranks as threads
// (fake_communicator.h): 2 and 3 stages (3 over 4 blocks: uneven) of a tiny gpt2 and a tiny llama give on every rank
// the whole decoder's logits and greedy tokens bit for bit, in prefills, steps and batched steps, and generate_batch's
// tokens (greedy and sampled, the window sliding); a unit of another stage is refused.
#include "shardtrain/model/decoder_stage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "../common/caught.h"
#include "decoder_test_util.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/decoder.h"
#include "shardtrain/model/family.h"
#include "shardtrain/model/generation.h"

namespace st {
namespace {

using testing::random_weights;
using testing::tiny_gpt2;
using testing::tiny_llama;

ModelConfig with_layers(ModelConfig c, int layers) {
  c.n_layer = layers;
  return c;
}

DecoderStage stage_of(const std::vector<UnitRange>& ranges, int s) {
  return DecoderStage{s, static_cast<int>(ranges.size()), ranges[static_cast<size_t>(s)], nullptr};
}

// The least largest stage_elements over every split of `model` into `stages` (each stage a block or more), by
// enumerating where each stage after the first starts.
int64_t best_by_enumeration(const ModelConfig& model, int max_batch, int stages) {
  const int L = model.n_layer;
  int64_t best = -1;
  std::vector<int> starts(static_cast<size_t>(stages), 0);  // the first block (1-based) of each stage
  std::function<void(int, int)> place = [&](int s, int from) {
    if (s == stages) {
      std::vector<UnitRange> ranges;
      for (int k = 0; k < stages; ++k)
        ranges.push_back(UnitRange{k == 0 ? 0 : starts[static_cast<size_t>(k)],
                                   k + 1 == stages ? L + 2 : starts[static_cast<size_t>(k) + 1]});
      int64_t worst = 0;
      for (int k = 0; k < stages; ++k) worst = std::max(worst, stage_elements(model, max_batch, stage_of(ranges, k)));
      if (best < 0 || worst < best) best = worst;
      return;
    }
    for (int b = from; b <= L - (stages - s) + 1; ++b) {
      starts[static_cast<size_t>(s)] = b;
      place(s + 1, b + 1);
    }
  };
  starts[0] = 1;
  place(1, 2);
  return best;
}

std::vector<ModelConfig> shapes() {
  ModelConfig untied = tiny_llama();  // an untied head: the last stage holds lm_head, not the embedding
  ModelConfig tied = tiny_llama();
  tied.tie_embeddings = true;
  ModelConfig wide_vocab = tiny_gpt2();  // an embedding of several blocks' size: stages at the ends hold fewer
  wide_vocab.vocab_size = 4000;
  return {tiny_gpt2(), untied, tied, wide_vocab};
}

TEST(SplitUnits, CoverEveryUnitOnceInOrderWithABlockOrMoreEach) {
  for (const ModelConfig& shape : shapes())
    for (int L = 1; L <= 7; ++L)
      for (int stages = 1; stages <= L; ++stages) {
        const ModelConfig c = with_layers(shape, L);
        const std::vector<UnitRange> ranges = split_units(c, 2, stages);
        ASSERT_EQ(ranges.size(), static_cast<size_t>(stages));
        EXPECT_EQ(ranges.front().first, 0);
        EXPECT_EQ(ranges.back().end, L + 2);
        for (int s = 0; s < stages; ++s) {
          const UnitRange& r = ranges[static_cast<size_t>(s)];
          if (s > 0) EXPECT_EQ(r.first, ranges[static_cast<size_t>(s) - 1].end) << L << " layers, stage " << s;
          EXPECT_GE(stage_layers(c, stage_of(ranges, s)).count(), 1) << L << " layers, stage " << s;
        }
      }
}

TEST(SplitUnits, TheLargestStageIsTheLeastOfEverySplit) {
  for (const ModelConfig& shape : shapes())
    for (int batch : {1, 16})
      for (int stages = 1; stages <= 6; ++stages) {
        const ModelConfig c = with_layers(shape, 6);
        const std::vector<UnitRange> ranges = split_units(c, batch, stages);
        int64_t worst = 0, total = 0;
        for (int s = 0; s < stages; ++s) {
          worst = std::max(worst, stage_elements(c, batch, stage_of(ranges, s)));
          total += stage_elements(c, batch, stage_of(ranges, s));
        }
        EXPECT_EQ(worst, best_by_enumeration(c, batch, stages))
            << to_string(c.arch) << ", batch " << batch << ", " << stages << " stages";
        // Every element once, but a tied head's copy of the embedding on the last stage.
        const bool copy = stages > 1 && (!c.is_llama() || c.tie_embeddings);
        EXPECT_EQ(total, stage_elements(c, batch, DecoderStage{}) + (copy ? build_units(c)[0].numel : 0));
      }
  // tiny_llama's embedding (12,288 elements) and untied head (12,320) each weigh about 1.5 of its blocks (8,448 with
  // a sequence's cache): 12 blocks over 4 stages go 2, 4, 4, 2 (largest 33,792; 3 each would give 37,632).
  const ModelConfig c = with_layers(tiny_llama(), 12);
  const std::vector<UnitRange> four = split_units(c, 1, 4);
  EXPECT_EQ(stage_elements(c, 1, stage_of(four, 1)), 33792);
  EXPECT_EQ(describe_split(c, four),
            "rank 0: embedding .. block.1; rank 1: block.2 .. block.5; rank 2: block.6 .. block.9; rank 3: block.10 .. "
            "head");
}

TEST(SplitUnits, FewerBlocksThanRanksAreRefused) {
  const Error e = testing::caught([] { split_units(with_layers(tiny_gpt2(), 2), 1, 3); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
  EXPECT_NE(std::string(e.what()).find("a layer split over 3 ranks needs a block for each, and this model has 2 "
                                       "(model.n_layer 2): run it on at most 2 rank(s), or without --split layers"),
            std::string::npos)
      << e.what();
}

TEST(HeldUnits, AStageHoldsItsRangeAndATiedHeadsEmbedding) {
  const ModelConfig gpt2 = with_layers(tiny_gpt2(), 4), untied = with_layers(tiny_llama(), 4);
  EXPECT_EQ(held_units(gpt2, DecoderStage{}), std::vector<bool>(6, true));
  EXPECT_EQ(stage_layers(gpt2, DecoderStage{}).count(), 4);
  const std::vector<UnitRange> ranges{{0, 2}, {2, 4}, {4, 6}};
  EXPECT_EQ(held_units(gpt2, stage_of(ranges, 0)), (std::vector<bool>{true, true, false, false, false, false}));
  EXPECT_EQ(held_units(gpt2, stage_of(ranges, 1)), (std::vector<bool>{false, false, true, true, false, false}));
  EXPECT_EQ(held_units(gpt2, stage_of(ranges, 2)), (std::vector<bool>{true, false, false, false, true, true}));
  EXPECT_EQ(held_units(untied, stage_of(ranges, 2)), (std::vector<bool>{false, false, false, false, true, true}));
  const LayerRange middle = stage_layers(gpt2, stage_of(ranges, 1));
  EXPECT_EQ(middle.first, 1);
  EXPECT_EQ(middle.end, 3);
  EXPECT_EQ(stage_layers(gpt2, stage_of(ranges, 2)).count(), 1);
}

// What a decoder gives for one script of calls: prefills of three sequences, a batched step (one idle), two batched
// steps that choose their tokens (greedy, then sampled with an idle row), a single step; every result in order.
struct Script {
  std::vector<std::vector<float>> logits;
  std::vector<std::vector<int32_t>> chosen;
};

Script run_script(Decoder& d) {
  Script out;
  out.logits.push_back(d.prefill({17, 250, 3, 3, 99}, 0));
  out.logits.push_back(d.prefill({5}, 1));
  out.logits.push_back(d.prefill({1, 2, 3, 4, 5, 6, 7, 8}, 2));
  out.logits.push_back(d.step_batch({42, Decoder::kIdle, 7}));
  out.chosen.push_back(d.step_batch_next({8, 9, 10}, SamplingOptions{0.0, 0, 0}, {0, 0, 0}));
  out.chosen.push_back(d.step_batch_next({11, 12, Decoder::kIdle}, SamplingOptions{0.9, 5, 3}, {4, 5, 6}));
  out.logits.push_back(d.step(123));
  return out;
}

class DecoderSplit : public ::testing::TestWithParam<std::tuple<ModelArch, int>> {
 protected:
  // 4 blocks: 3 stages are uneven.
  ModelConfig config() const {
    return with_layers(std::get<0>(GetParam()) == ModelArch::kLlama ? tiny_llama() : tiny_gpt2(), 4);
  }
  int stages() const { return std::get<1>(GetParam()); }
  // On each rank of a fake world of stages(), fn with that rank's loaded stage decoder of 3 sequences.
  void on_stages(const std::function<void(Decoder&, int rank)>& fn) const {
    const ModelConfig c = config();
    const std::vector<std::vector<float>> w = random_weights(c, 11);
    fake::spawn(stages(), [&](Communicator& comm) {
      const std::vector<UnitRange> ranges = split_units(c, 3, comm.world_size());
      const DecoderStage stage{comm.rank(), comm.world_size(), ranges[static_cast<size_t>(comm.rank())], &comm};
      const std::unique_ptr<Decoder> d = load_decoder(model_family(c.arch).make_cpu_decoder(c, 3, stage), w);
      fn(*d, comm.rank());
    });
  }
  std::unique_ptr<Decoder> whole() const {
    return load_decoder(model_family(config().arch).make_cpu_decoder(config(), 3, {}), random_weights(config(), 11));
  }
};
INSTANTIATE_TEST_SUITE_P(FamiliesAndStages, DecoderSplit,
                         ::testing::Combine(::testing::Values(ModelArch::kGpt2, ModelArch::kLlama),
                                            ::testing::Values(2, 3)),
                         [](const auto& info) {
                           return std::string(to_string(std::get<0>(info.param))) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "_stages";
                         });

TEST_P(DecoderSplit, EveryRankGetsTheWholeDecodersLogitsBitForBit) {
  const Script want = run_script(*whole());
  std::vector<Script> got(static_cast<size_t>(stages()));
  on_stages([&](Decoder& d, int rank) { got[static_cast<size_t>(rank)] = run_script(d); });
  for (int r = 0; r < stages(); ++r) {
    const Script& g = got[static_cast<size_t>(r)];
    ASSERT_EQ(g.logits.size(), want.logits.size());
    for (size_t i = 0; i < want.logits.size(); ++i) {
      // An idle row's logits are unspecified: the batched step's second row is left out.
      std::vector<float> a = g.logits[i], b = want.logits[i];
      if (i == 3) {
        const auto V = static_cast<ptrdiff_t>(config().vocab_size);
        std::fill(a.begin() + V, a.begin() + 2 * V, 0.0f);
        std::fill(b.begin() + V, b.begin() + 2 * V, 0.0f);
      }
      EXPECT_EQ(a, b) << "rank " << r << ", result " << i;
    }
    EXPECT_EQ(g.chosen, want.chosen) << "rank " << r;
  }
}

TEST_P(DecoderSplit, GenerationGivesTheWholeDecodersTokensOnEveryRank) {
  // Four prompts (a group of three, then one), 30 tokens each past seq_len 20: every sequence slides.
  const std::vector<std::vector<int32_t>> prompts = {{7}, {72, 104, 101, 32, 113}, {1, 2, 3, 4, 5, 6, 7, 8, 299}, {42}};
  for (const SamplingOptions& o : {SamplingOptions{0.0, 0, 0}, SamplingOptions{0.9, 40, 5}}) {
    GenerationStats stats;
    const std::vector<std::vector<int32_t>> want = generate_batch(*whole(), prompts, 30, o, &stats);
    EXPECT_GE(stats.slides, 4);
    on_stages([&](Decoder& d, int rank) {
      EXPECT_EQ(generate_batch(d, prompts, 30, o), want) << "rank " << rank << ", temperature " << o.temperature;
    });
  }
}

TEST(DecoderSplitLoad, AUnitOfAnotherStageIsRefused) {
  const ModelConfig c = with_layers(tiny_gpt2(), 4);
  const std::vector<std::vector<float>> w = random_weights(c, 3);
  fake::spawn(2, [&](Communicator& comm) {
    const std::vector<UnitRange> ranges = split_units(c, 1, 2);
    const DecoderStage stage{comm.rank(), 2, ranges[static_cast<size_t>(comm.rank())], &comm};
    const std::unique_ptr<Decoder> d = model_family(c.arch).make_cpu_decoder(c, 1, stage);
    const int other = comm.rank() == 0 ? 4 : 1;  // a block of the other stage
    std::vector<float> values = w[static_cast<size_t>(other)];
    const Error e = testing::caught([&] { d->load_unit(other, values); });
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << "rank " << comm.rank() << " loading unit " << other;
    EXPECT_NE(std::string(e.what()).find("unit block." + std::to_string(other - 1) +
                                         " belongs to another stage of the layer split"),
              std::string::npos)
        << e.what();
    EXPECT_FALSE(d->loaded());
  });
}

}  // namespace
}  // namespace st
