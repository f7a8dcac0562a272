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

// Hugging Face's shapes (config.json): layers, hidden, heads, K/V heads, intermediate, vocabulary.
ModelConfig llama(int L, int C, int H, int KV, int F, int V, bool tied = true, bool qkv_bias = false) {
  ModelConfig c;
  c.arch = ModelArch::kLlama;
  c.n_layer = L;
  c.n_embd = C;
  c.n_head = H;
  c.n_kv_head = KV;
  c.ffn_dim = F;
  c.vocab_size = V;
  c.seq_len = 2048;
  c.tie_embeddings = tied;
  c.qkv_bias = qkv_bias;
  return c;
}

// The parameter counts Hugging Face reports for these models (their vocabularies are multiples of 128: no padding).
TEST(Units, LlamaFamilyHasHuggingFaceParameterCounts) {
  EXPECT_EQ(count_params(build_units(llama(16, 2048, 32, 8, 8192, 128256))), 1235814400);          // Llama-3.2-1B
  EXPECT_EQ(count_params(build_units(llama(28, 3072, 24, 8, 8192, 128256))), 3212749824);          // Llama-3.2-3B
  EXPECT_EQ(count_params(build_units(llama(24, 896, 14, 2, 4864, 151936, true, true))), 494032768);  // Qwen2.5-0.5B
  EXPECT_EQ(count_params(build_units(llama(32, 960, 15, 5, 2560, 49152))), 361821120);             // SmolLM2-360M
}

TEST(Units, LlamaLayoutStacksQkvAndGateUp) {
  const ModelConfig c = llama(2, 64, 8, 2, 96, 1000, /*tied=*/false, /*qkv_bias=*/true);  // D = 8, vocab -> 1024
  const auto units = build_units(c);
  ASSERT_EQ(units.size(), 4u);
  EXPECT_EQ(units[0].tensors.size(), 1u);  // no position table
  EXPECT_EQ(units[0].tensor("embed_tokens").shape, (std::vector<int64_t>{1024, 64}));
  std::vector<std::string> names;
  for (const TensorSpec& t : units[1].tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"attn_norm.weight", "attn.qkv.weight", "attn.qkv.bias", "attn.o.weight",
                                             "mlp_norm.weight", "mlp.gate_up.weight", "mlp.down.weight"}));
  EXPECT_EQ(units[1].tensor("attn.qkv.weight").shape, (std::vector<int64_t>{(8 + 2 * 2) * 8, 64}));
  EXPECT_EQ(units[1].tensor("mlp.gate_up.weight").shape, (std::vector<int64_t>{2 * 96, 64}));
  EXPECT_EQ(units[1].tensor("mlp.down.weight").shape, (std::vector<int64_t>{64, 96}));
  EXPECT_EQ(units[3].tensor("lm_head").shape, (std::vector<int64_t>{1024, 64}));
  ModelConfig tied = c;
  tied.tie_embeddings = true;
  tied.qkv_bias = false;
  EXPECT_EQ(build_units(tied)[3].tensors.size(), 1u);  // norm.weight only
  EXPECT_EQ(build_units(tied)[1].tensors.size(), 6u);
  for (const UnitLayout& u : units)
    for (const TensorSpec& t : u.tensors) {
      EXPECT_EQ(t.weight_decay, u.kind == UnitKind::kBlock && t.shape.size() == 2) << u.name << " " << t.name;
      // Hugging Face's initialisation: every matrix N(0, 0.02) (the padding rows zero), norms 1, biases 0.
      const InitKind want = t.name.find("norm") != std::string::npos ? InitKind::kOnes
                            : t.name.find("bias") != std::string::npos ? InitKind::kZeros
                            : u.kind == UnitKind::kBlock ? InitKind::kNormal
                                                         : InitKind::kEmbeddingPadded;
      EXPECT_EQ(t.init, want) << u.name << " " << t.name;
    }
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
