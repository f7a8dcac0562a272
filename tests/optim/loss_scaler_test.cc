#include "shardtrain/optim/loss_scaler.h"

#include <gtest/gtest.h>

namespace st {
namespace {

TEST(LossScaler, Fp16BacksOffOnOverflowAndGrowsAfterTheInterval) {
  LossScaler s = LossScaler::for_dtype(DType::kF16);
  ASSERT_TRUE(s.active());
  EXPECT_EQ(s.scale(), 65536.0);
  s.update(true);
  s.update(false);
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.good_steps(), 0);
  for (int64_t i = 0; i < LossScaler::kGrowthInterval - 1; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 32768.0);
  EXPECT_EQ(s.good_steps(), LossScaler::kGrowthInterval - 1);
  s.update(true);
  EXPECT_EQ(s.scale(), 65536.0);
  EXPECT_EQ(s.good_steps(), 0);
  s.restore(1024.0, 17);
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_EQ(s.good_steps(), 17);
}

TEST(LossScaler, InactiveForBf16AndFp32) {
  for (DType t : {DType::kBF16, DType::kF32}) {
    LossScaler s = LossScaler::for_dtype(t);
    EXPECT_FALSE(s.active());
    s.update(false);
    s.restore(8.0, 3);
    EXPECT_EQ(s.scale(), 1.0);
    EXPECT_EQ(s.good_steps(), 0);
  }
}

}  // namespace
}  // namespace st
