// NF4's storage size and round trip; nf4.numpy_reference (nf4_test.py) holds the codes against an independent
// NumPy quantiser bit for bit.
#include "shardtrain/kernels/nf4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace st {
namespace {

TEST(Nf4, StorageIsHalfAByteAWeightPlusTheAbsmaxes) {
  // 4096 weights: 2048 bytes of codes, 64 absmax codes, one fp32 scale, the fp32 offset.
  EXPECT_EQ(nf4_bytes(4096), 2048 + 64 + 4 + 4);
  // 65 weights: 33 bytes (a half-filled last byte), two blocks, one group.
  EXPECT_EQ(nf4_bytes(65), 33 + 2 + 4 + 4);
  // Llama-3.1-8B's blocks (6,979,321,856 weights in its linear layers) in 3.35 GiB.
  EXPECT_NEAR(static_cast<double>(nf4_bytes(6979321856)) / (1 << 30), 3.35, 0.01);
}

TEST(Nf4, LevelsAreOrderedWithAnExactZeroAndNearestCodesTieLow) {
  for (int k = 1; k < 16; ++k) EXPECT_LT(kNf4Levels[static_cast<size_t>(k - 1)], kNf4Levels[static_cast<size_t>(k)]);
  EXPECT_EQ(kNf4Levels[7], 0.0f);
  EXPECT_EQ(nf4_code(0.0f), 7);
  EXPECT_EQ(nf4_code(1.0f), 15);
  EXPECT_EQ(nf4_code(-1.0f), 0);
  EXPECT_EQ(nf4_code(0.03f), 7);
  EXPECT_EQ(nf4_code(0.05f), 8);
  EXPECT_EQ(nf4_code(0.5f * (kNf4Levels[13] + kNf4Levels[14])), 13);  // a float32 midpoint equidistant: the lower
}

// Each weight comes back within half the widest gap between levels (0.16 of the range) times its block's absmax,
// plus the absmax's own rounding (half a step of 1/127 of the group's spread).
TEST(Nf4, RoundTripIsWithinHalfALevelGap) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(64 * 1000 + 17);
  for (float& x : w) x = normal(rng);
  const Nf4Quantized q = nf4_quantize(w.data(), static_cast<int64_t>(w.size()), "w");
  std::vector<float> back(w.size());
  nf4_dequantize(q, back.data());
  float widest = 0.0f;
  for (int k = 1; k < 16; ++k)
    widest = std::max(widest, kNf4Levels[static_cast<size_t>(k)] - kNf4Levels[static_cast<size_t>(k - 1)]);
  double error2 = 0.0, signal2 = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    float absmax = 0.0f;
    const size_t b = i / kNf4BlockSize;
    for (size_t j = b * kNf4BlockSize; j < std::min(w.size(), (b + 1) * kNf4BlockSize); ++j)
      absmax = std::max(absmax, std::fabs(w[j]));
    const float dq = std::fabs(nf4_absmax(q, static_cast<int64_t>(b)) - absmax);
    ASSERT_LE(std::fabs(back[i] - w[i]), 0.5f * widest * absmax + dq + 1e-9f) << "weight " << i;
    error2 += (back[i] - w[i]) * (back[i] - w[i]);
    signal2 += w[i] * w[i];
  }
  // Signal to noise of a normal tensor in NF4: about 20 dB.
  EXPECT_GT(10.0 * std::log10(signal2 / error2), 18.0);
}

}  // namespace
}  // namespace st
