// LoRA's unit lists (model/lora.h, units.h): which tensors train, where each lies, how they initialise, and what
// lora.* refuses.
#include "shardtrain/model/lora.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "../common/config_problem.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

ModelConfig llama_shape() {
  ModelConfig c;
  c.arch = ModelArch::kLlama;
  c.n_layer = 3;
  c.n_embd = 64;
  c.n_head = 8;
  c.n_kv_head = 2;
  c.ffn_dim = 96;
  c.vocab_size = 300;
  c.seq_len = 16;
  c.qkv_bias = true;
  c.tie_embeddings = false;
  return c;
}

ModelConfig gpt2_shape() {
  ModelConfig c;
  c.n_layer = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.vocab_size = 100;
  c.seq_len = 16;
  return c;
}

std::set<std::string> trainable(const std::vector<UnitLayout>& units) {
  std::set<std::string> out;
  for (const UnitLayout& u : units)
    for (const TensorSpec& t : u.tensors)
      if (!t.frozen) out.insert(u.name + "." + t.name);
  return out;
}

// The trainable tensors are exactly the adapters of the targeted layers, with PEFT's shapes; every base tensor is
// frozen, keeps its shape, and the model's parameter count grows by the adapters alone.
TEST(LoraUnits, TrainableTensorsAreExactlyTheAdapters) {
  ModelConfig c = llama_shape();
  const std::vector<UnitLayout> base = build_units(c);
  c.lora.rank = 4;
  c.lora.targets = "v, gate,down";
  const std::vector<UnitLayout> units = build_units(c);
  std::set<std::string> want;
  for (int l = 0; l < c.n_layer; ++l)
    for (const char* t : {"v", "gate", "down"})
      for (const char* w : {"A", "B"}) want.insert("block." + std::to_string(l) + ".lora." + t + "." + w);
  EXPECT_EQ(trainable(units), want);
  const int64_t C = 64, KV = 2 * 8, F = 96, r = 4;  // head dim 8
  EXPECT_EQ(units[1].tensor("lora.v.A").shape, (std::vector<int64_t>{r, C}));
  EXPECT_EQ(units[1].tensor("lora.v.B").shape, (std::vector<int64_t>{KV, r}));
  EXPECT_EQ(units[1].tensor("lora.gate.B").shape, (std::vector<int64_t>{F, r}));
  EXPECT_EQ(units[1].tensor("lora.down.A").shape, (std::vector<int64_t>{r, F}));
  EXPECT_EQ(units[1].tensor("lora.down.B").shape, (std::vector<int64_t>{C, r}));
  const int64_t adapters_per_block = r * C + KV * r + r * C + F * r + r * F + C * r;
  EXPECT_EQ(count_trainable_params(units), c.n_layer * adapters_per_block);
  EXPECT_EQ(count_params(units), count_params(base) + c.n_layer * adapters_per_block);
  for (size_t u = 0; u < units.size(); ++u) {
    for (const TensorSpec& b : base[u].tensors) {
      const TensorSpec& t = units[u].tensor(b.name);
      EXPECT_TRUE(t.frozen) << units[u].name << "." << b.name;
      EXPECT_EQ(t.shape, b.shape);
      EXPECT_EQ(t.init_index, b.offset);  // draws as the base model does
    }
  }
  EXPECT_EQ(units[0].numel, 0);
  EXPECT_EQ(units.back().numel, 0);
}

// Trainable tensors fill [0, numel) and frozen ones [numel, numel + frozen_numel), each without gap or overlap; the
// block views find every tensor by name whatever its place.
TEST(LoraUnits, TrainableTensorsComeFirstThenFrozenOnes) {
  for (ModelConfig c : {llama_shape(), gpt2_shape()}) {
    c.lora.rank = 2;
    for (const UnitLayout& u : build_units(c)) {
      std::vector<const TensorSpec*> order;
      for (const TensorSpec& t : u.tensors) order.push_back(&t);
      std::stable_sort(order.begin(), order.end(),
                       [](const TensorSpec* a, const TensorSpec* b) { return !a->frozen && b->frozen; });
      int64_t at = 0;
      for (const TensorSpec* t : order) {
        EXPECT_EQ(t->offset, at) << u.name << "." << t->name;
        at += t->numel;
        if (!t->frozen) EXPECT_LE(at, u.numel);
      }
      EXPECT_EQ(at, u.numel + u.frozen_numel) << u.name;
    }
  }
}

// A frozen base initialises as the same model trained in full (element for element, by its init_index); A is
// Kaiming-uniform in [-1/sqrt(in), 1/sqrt(in)) and B zero.
TEST(LoraUnits, BaseInitialisesAsTheFullModelAndAdaptersAsPeft) {
  ModelConfig c = llama_shape();
  const std::vector<UnitLayout> base = build_units(c);
  c.lora.rank = 3;
  const std::vector<UnitLayout> units = build_units(c);
  const uint64_t seed = 77;
  for (size_t u = 0; u < units.size(); ++u) {
    std::vector<float> full(static_cast<size_t>(base[u].numel)), frozen(static_cast<size_t>(units[u].frozen_numel)),
        train(static_cast<size_t>(units[u].numel));
    init_unit_range(base[u], c, seed, 0, base[u].numel, full.data());
    init_unit_range(units[u], c, seed, 0, units[u].frozen_numel, frozen.data(), Segment::kFrozen);
    init_unit_range(units[u], c, seed, 0, units[u].numel, train.data());
    for (const TensorSpec& t : units[u].tensors) {
      if (t.frozen) {
        const int64_t at = t.offset - units[u].numel;
        EXPECT_TRUE(std::equal(frozen.begin() + at, frozen.begin() + at + t.numel, full.begin() + t.init_index))
            << units[u].name << "." << t.name;
      } else if (t.name.back() == 'A') {
        const float bound = 1.0f / std::sqrt(static_cast<float>(t.shape.back()));
        const auto [lo, hi] = std::minmax_element(train.begin() + t.offset, train.begin() + t.offset + t.numel);
        EXPECT_GE(*lo, -bound);
        EXPECT_LT(*hi, bound);
        EXPECT_GT(*hi - *lo, bound);  // spread over the range, not a constant
      } else {
        EXPECT_TRUE(std::all_of(train.begin() + t.offset, train.begin() + t.offset + t.numel,
                                [](float v) { return v == 0.0f; }))
            << units[u].name << "." << t.name;
      }
    }
  }
}

TEST(LoraUnits, ScaleIsAlphaOverRankOrOverItsRoot) {
  LoraConfig l;
  l.rank = 16;
  l.alpha = 32;
  EXPECT_FLOAT_EQ(lora_scale(l), 2.0f);
  l.rslora = true;
  EXPECT_FLOAT_EQ(lora_scale(l), 8.0f);
}

// The family's own names only, each once; the error names the key and lists what the family takes.
TEST(LoraUnits, TargetsTakeTheFamilysNames) {
  ModelConfig c = gpt2_shape();
  c.lora.rank = 2;
  c.lora.targets = "fc_proj,qkv";
  std::vector<std::string> names;
  for (const LoraLinear& l : lora_targets(c)) names.push_back(l.name);
  EXPECT_EQ(names, (std::vector<std::string>{"qkv", "fc_proj"}));  // the family's order
  for (const char* bad : {"q", "qkv,qkv", "", "qkv,"}) {
    c.lora.targets = bad;
    try {
      lora_targets(c);
      ADD_FAILURE() << bad << " was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_NE(std::string(e.what()).find("lora.targets"), std::string::npos) << e.what();
    }
  }
  c.lora.targets = "q";
  try {
    lora_targets(c);
    ADD_FAILURE() << "llama's q was taken for gpt2";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qkv, proj, fc, fc_proj"), std::string::npos) << e.what();
  }
}

TEST(LoraConfigKeys, RefusedWithoutARankOrOutOfRange) {
  const auto problem = testing::config_problem;
  EXPECT_NE(problem({"--lora.alpha=16"}).find("lora.alpha applies when lora.rank > 0"), std::string::npos);
  EXPECT_NE(problem({"--lora.rank=-1"}).find("lora.rank must be >= 0"), std::string::npos);
  EXPECT_NE(problem({"--lora.rank=4", "--lora.alpha=0"}).find("lora.alpha must be finite and > 0"), std::string::npos);
  EXPECT_NE(problem({"--lora.rank=4", "--lora.targets=q"}).find("lora.targets"), std::string::npos);
  EXPECT_NE(problem({"--lora.rank=4", "--lora.dropout=1"}).find("lora.dropout must be in [0, 1)"), std::string::npos);
  EXPECT_EQ(problem({"--lora.rank=4", "--lora.dropout=0.1"}), "");
  EXPECT_EQ(problem({"--lora.rank=4", "--lora.base_dtype=nf4"}), "");
  EXPECT_NE(problem({"--lora.rank=4", "--lora.base_dtype=nf4", "--init.from=base.safetensors", "--ckpt.export=out.h5"})
                .find("ckpt export STEP --merged"),
            std::string::npos);
  EXPECT_EQ(problem({"--lora.rank=4", "--lora.base_dtype=nf4", "--ckpt.export=out.h5"}), "");
  EXPECT_NE(problem({"--lora.base_dtype=nf4"}).find("lora.base_dtype applies when lora.rank > 0"), std::string::npos);
  EXPECT_EQ(problem({"--lora.rank=4", "--lora.alpha=8", "--lora.targets=qkv,proj"}), "");
}

}  // namespace
}  // namespace st
