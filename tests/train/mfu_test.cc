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
  EXPECT_DOUBLE_EQ(flops_per_token(m, P), 6.0 * 124475904 + 6.0 * 12 * 768 * 1024);
  // 1.0M tok/s on two H200s: 1e6 x 803.48e6 / (2 x 989e12) = 40.6 %.
  EXPECT_NEAR(*mfu(m, P, 1.0e6, 2, "NVIDIA H200"), 0.40621, 1e-4);
  EXPECT_FALSE(mfu(m, P, 1.0e6, 2, "Some Future GPU").has_value());
}

}  // namespace
}  // namespace st
