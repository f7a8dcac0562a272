#include "shardtrain/train/mfu.h"

#include <gtest/gtest.h>

#include "shardtrain/model/units.h"

namespace st {
namespace {

TEST(Mfu, PeaksByDeviceName) {
  EXPECT_EQ(dense_bf16_peak("NVIDIA H200"), 989e12);
  EXPECT_EQ(dense_bf16_peak("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(dense_bf16_peak("NVIDIA GeForce RTX 4090"), 165.2e12);
  EXPECT_EQ(dense_bf16_peak("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_FALSE(dense_bf16_peak("cpu").has_value());
  EXPECT_FALSE(dense_bf16_peak("NVIDIA GeForce GTX 1080").has_value());
}

// GPT-2 124M at T=1024: 6 x 124.5M + 6 x 12 x 768 x 1024 = 803.6 MFLOP per token (padded vocab 50304).
TEST(Mfu, Gpt2SmallAtKnownThroughput) {
  ModelConfig m;
  m.n_layer = 12;
  m.n_head = 12;
  m.n_embd = 768;
  m.vocab_size = 50257;
  m.seq_len = 1024;
  const int64_t P = count_params(build_units(m));
  EXPECT_EQ(P, 124475904);
  EXPECT_DOUBLE_EQ(flops_per_token(m), 6.0 * 124475904 + 6.0 * 12 * 768 * 1024);
  // 1.0M tok/s on two H200s: 1e6 x 803.48e6 / (2 x 989e12) = 40.6 %.
  EXPECT_NEAR(*mfu(flops_per_token(m), 1.0e6, 2, "NVIDIA H200"), 0.40621, 1e-4);
  EXPECT_FALSE(mfu(flops_per_token(m), 1.0e6, 2, "Some Future GPU").has_value());
}

// LoRA: 4 per frozen parameter (forward and input gradient), 6 per adapter parameter. GPT-2 small with r = 8 on
// qkv alone: 12 x (8 x 768 + 2304 x 8) = 294,912 adapter parameters.
TEST(Mfu, LoraCountsNoWeightGradientForTheFrozenBase) {
  ModelConfig m;
  m.n_layer = 12;
  m.n_head = 12;
  m.n_embd = 768;
  m.vocab_size = 50257;
  m.seq_len = 1024;
  m.lora.rank = 8;
  m.lora.targets = "qkv";
  EXPECT_DOUBLE_EQ(flops_per_token(m), 4.0 * 124475904 + 6.0 * 294912 + 6.0 * 12 * 768 * 1024);
}

// Llama-3.2-1B's shape: P = 16 x (3072 x 2048 (q, k, v with 8 K/V heads) + 2048^2 + 3 x 8192 x 2048 + 2 x 2048
// (norms)) + 2048 + 128256 x 2048 (the tied head, counted once) = 1,235,814,400: the model's parameter count, which
// is what the Hugging Face peer counts.
TEST(Mfu, LlamaCountsTheMatmulParameters) {
  ModelConfig m;
  m.arch = ModelArch::kLlama;
  m.n_layer = 16;
  m.n_head = 32;
  m.n_kv_head = 8;
  m.n_embd = 2048;
  m.ffn_dim = 8192;
  m.vocab_size = 128256;
  m.seq_len = 2048;
  EXPECT_DOUBLE_EQ(flops_per_token(m), 6.0 * 1235814400 + 6.0 * 16 * 2048 * 2048);
  m.tie_embeddings = false;  // the head is its own tensor, still one matrix product
  EXPECT_DOUBLE_EQ(flops_per_token(m), 6.0 * 1235814400 + 6.0 * 16 * 2048 * 2048);
}

}  // namespace
}  // namespace st
