#include "shardtrain/model/llama/llama_model.h"

#include <gtest/gtest.h>

#include "shardtrain/model/family.h"

namespace st {
namespace {

ModelConfig tiny_llama(bool tied, bool qkv_bias) {
  ModelConfig c;
  c.arch = ModelArch::kLlama;
  c.n_layer = 3;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.ffn_dim = 48;
  c.vocab_size = 300;
  c.seq_len = 24;
  c.tie_embeddings = tied;
  c.qkv_bias = qkv_bias;
  return c;
}

// The memory plan counts the model before it exists: the count must be what the constructor allocates.
// Also with LoRA adapters, and with their dropout buffers.
TEST(LlamaModel, FootprintIsWhatItAllocates) {
  for (const Recompute recompute : {Recompute(false), Recompute(true), Recompute::first(1), Recompute::first(2)})
    for (bool tied : {false, true})
      for (float dropout : {-1.0f, 0.0f, 0.1f}) {  // -1: no LoRA
        ModelConfig c = tiny_llama(tied, !tied);
        if (dropout >= 0) {
          c.lora.rank = 3;
          c.lora.targets = "q,o,down";
          c.lora.dropout = dropout;
        }
        const LlamaModel m(c, 3, recompute);
        EXPECT_EQ(LlamaModel::footprint_bytes(c, 3, recompute), m.allocated_bytes())
            << recompute.count(c.n_layer) << tied << dropout;
        EXPECT_EQ(model_family(ModelArch::kLlama).cpu_footprint_bytes(c, 3, recompute), m.allocated_bytes());
      }
}

// An untied head trains its own lm_head and leaves the embedding's classifier gradient alone; tied, the classifier's
// gradient lands in embed_tokens' rows of tokens that never occur in the batch.
TEST(LlamaModel, TiedHeadSendsTheClassifierGradientToTheEmbedding) {
  for (bool tied : {false, true}) {
    const ModelConfig c = tiny_llama(tied, false);
    LlamaModel m(c, 1);
    const std::vector<UnitLayout>& units = m.units();
    std::vector<std::vector<float>> p, g;
    for (const UnitLayout& u : units) {
      p.emplace_back(u.numel);
      init_unit_range(u, c, 3, 0, u.numel, p.back().data());
      g.emplace_back(u.numel, 0.0f);
    }
    std::vector<int32_t> tokens(c.seq_len, 7), targets(c.seq_len, 9);  // token 7 only; row 8 is never looked up
    m.embedding_forward(p[0].data(), tokens.data(), 1, c.seq_len);
    for (int l = 0; l < c.n_layer; ++l) m.block_forward(l, p[1 + l].data());
    const double loss_sum = m.head_forward_backward(p.back().data(), p[0].data(), targets.data(), 1.0f / c.seq_len,
                                                    g.back().data(), g[0].data());
    EXPECT_GT(loss_sum, 0.0);
    for (int l = c.n_layer - 1; l >= 0; --l) m.block_backward(l, p[1 + l].data(), g[1 + l].data());
    m.embedding_backward(g[0].data());
    const float* row8 = g[0].data() + 8 * c.n_embd;
    float row8_abs = 0;
    for (int i = 0; i < c.n_embd; ++i) row8_abs += std::abs(row8[i]);
    if (tied) {
      EXPECT_GT(row8_abs, 0.0f);
    } else {
      EXPECT_EQ(row8_abs, 0.0f);
      const float* head8 = g.back().data() + units.back().tensor("lm_head").offset + 8 * c.n_embd;
      float head8_abs = 0;
      for (int i = 0; i < c.n_embd; ++i) head8_abs += std::abs(head8[i]);
      EXPECT_GT(head8_abs, 0.0f);
    }
    // The padding rows (300..383) never enter the loss: their gradient is zero either way.
    const float* classifier = tied ? g[0].data() : g.back().data() + units.back().tensor("lm_head").offset;
    for (int64_t i = int64_t{c.vocab_size} * c.n_embd; i < int64_t{c.padded_vocab()} * c.n_embd; ++i)
      ASSERT_EQ(classifier[i], 0.0f) << i;
  }
}

}  // namespace
}  // namespace st
