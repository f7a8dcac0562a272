#include "shardtrain/model/units.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace st {
namespace {

ModelConfig gpt2_124m() {
  ModelConfig c;
  c.n_layer = 12;
  c.n_head = 12;
  c.n_embd = 768;
  c.vocab_size = 50257;
  c.seq_len = 1024;
  return c;
}

TEST(Units, Gpt2SmallHasLlmcParameterCount) {
  const auto units = build_units(gpt2_124m());
  ASSERT_EQ(units.size(), 14u);
  // llm.c's GPT-2 124M with the vocabulary padded to 50304.
  EXPECT_EQ(count_params(units), 124475904);
  EXPECT_EQ(gpt2_124m().padded_vocab(), 50304);
  EXPECT_EQ(units[0].tensor("wte").shape, (std::vector<int64_t>{50304, 768}));
  EXPECT_EQ(units[1].numel, 12 * 768 * 768 + 13 * 768);
}

TEST(Units, FlatLayoutIsContiguousAndOrdered) {
  for (const UnitLayout& u : build_units(gpt2_124m())) {
    int64_t next = 0;
    for (const TensorSpec& t : u.tensors) {
      EXPECT_EQ(t.offset, next) << u.name << " " << t.name;
      next += t.numel;
    }
    EXPECT_EQ(next, u.numel) << u.name;
  }
}

TEST(Units, WeightDecayOnlyOnBlockMatrices) {
  for (const UnitLayout& u : build_units(gpt2_124m()))
    for (const TensorSpec& t : u.tensors) {
      const bool matrix_in_block = u.kind == UnitKind::kBlock && t.shape.size() == 2;
      EXPECT_EQ(t.weight_decay, matrix_in_block) << u.name << " " << t.name;
    }
}

TEST(Units, InitIsIndependentOfHowTheUnitIsSplit) {
  ModelConfig c;
  c.n_layer = 2;
  c.n_embd = 48;
  c.n_head = 4;
  c.vocab_size = 300;  // padded to 384
  c.seq_len = 16;
  for (const UnitLayout& u : build_units(c)) {
    std::vector<float> whole(u.numel);
    init_unit_range(u, c, 7, 0, u.numel, whole.data());
    for (int parts : {2, 3, 7}) {
      std::vector<float> pieced(u.numel);
      const int64_t step = (u.numel + parts - 1) / parts;
      for (int64_t b = 0; b < u.numel; b += step) {
        const int64_t e = std::min(u.numel, b + step);
        init_unit_range(u, c, 7, b, e, pieced.data() + b);
      }
      EXPECT_EQ(pieced, whole) << u.name << " split in " << parts;
    }
  }
}

TEST(Units, InitFollowsGpt2) {
  ModelConfig c;
  c.n_layer = 8;
  c.n_embd = 256;
  c.n_head = 4;
  c.vocab_size = 1000;  // padded to 1024
  c.seq_len = 64;
  const auto units = build_units(c);
  auto stats = [&](const UnitLayout& u, const std::string& name) {
    std::vector<float> buf(u.numel);
    init_unit_range(u, c, 1, 0, u.numel, buf.data());
    const TensorSpec& t = u.tensor(name);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < t.numel; ++i) {
      s += buf[t.offset + i];
      s2 += static_cast<double>(buf[t.offset + i]) * buf[t.offset + i];
    }
    return std::make_pair(s / t.numel, std::sqrt(s2 / t.numel));
  };
  EXPECT_NEAR(stats(units[1], "mlp.fc.weight").second, 0.02, 0.0005);
  EXPECT_NEAR(stats(units[1], "attn.proj.weight").second, 0.02 / std::sqrt(16.0), 0.0005);
  EXPECT_NEAR(stats(units[1], "mlp.proj.weight").second, 0.02 / std::sqrt(16.0), 0.0003);
  EXPECT_EQ(stats(units[1], "ln1.weight"), std::make_pair(1.0, 1.0));
  EXPECT_EQ(stats(units[1], "attn.qkv.bias"), std::make_pair(0.0, 0.0));
  // Padding rows of wte are zero; real rows are N(0, 0.02).
  std::vector<float> emb(units[0].numel);
  init_unit_range(units[0], c, 1, 0, units[0].numel, emb.data());
  for (int64_t i = 1000 * 256; i < 1024 * 256; ++i) ASSERT_EQ(emb[i], 0.0f) << i;
  double s2 = 0;
  for (int64_t i = 0; i < 1000 * 256; ++i) s2 += static_cast<double>(emb[i]) * emb[i];
  EXPECT_NEAR(std::sqrt(s2 / (1000 * 256)), 0.02, 0.0002);
}

}  // namespace
}  // namespace st
