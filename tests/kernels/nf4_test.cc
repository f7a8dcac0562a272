// NF4's storage size and layout in one buffer, quantising into a view, and the round trip; nf4.numpy_reference
// (nf4_test.py) holds the codes against an independent NumPy quantiser bit for bit.
#include "shardtrain/kernels/nf4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../common/caught.h"
#include "shardtrain/core/error.h"

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
  nf4_dequantize(q.view(), back.data());
  float widest = 0.0f;
  for (int k = 1; k < 16; ++k)
    widest = std::max(widest, kNf4Levels[static_cast<size_t>(k)] - kNf4Levels[static_cast<size_t>(k - 1)]);
  double error2 = 0.0, signal2 = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    float absmax = 0.0f;
    const size_t b = i / kNf4BlockSize;
    for (size_t j = b * kNf4BlockSize; j < std::min(w.size(), (b + 1) * kNf4BlockSize); ++j)
      absmax = std::max(absmax, std::fabs(w[j]));
    const float dq = std::fabs(nf4_absmax(q.view(), static_cast<int64_t>(b)) - absmax);
    ASSERT_LE(std::fabs(back[i] - w[i]), 0.5f * widest * absmax + dq + 1e-9f) << "weight " << i;
    error2 += (back[i] - w[i]) * (back[i] - w[i]);
    signal2 += w[i] * w[i];
  }
  // Signal to noise of a normal tensor in NF4: about 20 dB.
  EXPECT_GT(10.0 * std::log10(signal2 / error2), 18.0);
}

// One buffer: the offset, the scales, then the codes 4-byte aligned and the absmax codes, end to end.
TEST(Nf4, LayoutPutsTheFloatsFirstAndTheSectionsEndToEnd) {
  const Nf4Layout l65 = nf4_layout(65);  // 2 blocks, 1 group, 33 code bytes
  EXPECT_EQ(l65.absmax_offset, 0);
  EXPECT_EQ(l65.absmax_scales, 4);
  EXPECT_EQ(l65.codes, 8);
  EXPECT_EQ(l65.absmax_codes, 41);
  EXPECT_EQ(l65.bytes, 43);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, int64_t{65}, int64_t{64 * 256},
                    int64_t{64 * 256 + 1}, int64_t{1000003}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const Nf4Layout l = nf4_layout(n);
    EXPECT_EQ(nf4_blocks(n), (n + 63) / 64);
    EXPECT_EQ(nf4_groups(n), (nf4_blocks(n) + 255) / 256);
    EXPECT_EQ(l.absmax_offset, 0);
    EXPECT_EQ(l.absmax_scales, 4);
    EXPECT_EQ(l.codes, 4 + 4 * nf4_groups(n));
    EXPECT_EQ(l.codes % 4, 0);
    EXPECT_EQ(l.absmax_codes, l.codes + (n + 1) / 2);
    EXPECT_EQ(l.bytes, l.absmax_codes + nf4_blocks(n));
    EXPECT_EQ(l.bytes, nf4_bytes(n));
  }
}

TEST(Nf4, ViewOfABufferPointsAtItsSectionsAndNeedsFourByteAlignment) {
  const int64_t n = 64 * 300 + 7;
  const Nf4Layout l = nf4_layout(n);
  std::vector<uint8_t> buffer(static_cast<size_t>(l.bytes) + 4);
  const Nf4View v = nf4_view(buffer.data(), n);
  EXPECT_EQ(v.n, n);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(v.absmax_offset), buffer.data() + l.absmax_offset);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(v.absmax_scales), buffer.data() + l.absmax_scales);
  EXPECT_EQ(v.codes, buffer.data() + l.codes);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(v.absmax_codes), buffer.data() + l.absmax_codes);
  const Nf4ConstView c = nf4_view(static_cast<const uint8_t*>(buffer.data()), n);
  EXPECT_EQ(c.codes, v.codes);
  EXPECT_EQ(c.absmax_offset, v.absmax_offset);
  const Error e = ::st::testing::caught([&] { nf4_view(buffer.data() + 2, n); });
  EXPECT_EQ(e.kind(), ErrorKind::kInternal);
  EXPECT_NE(std::string(e.what()).find("not 4-byte aligned"), std::string::npos) << e.what();
}

// Quantising into a view of one (poisoned) buffer writes every byte, and the same values as into an Nf4Quantized.
TEST(Nf4, QuantizeIntoABufferEqualsNf4Quantized) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(64 * 256 * 2 + 64 * 3 + 33);  // 3 groups, the last short; a half-filled last code byte
  for (float& x : w) x = normal(rng);
  std::fill(w.begin() + 640, w.begin() + 704, 0.0f);  // an all-zero block
  const auto n = static_cast<int64_t>(w.size());
  const Nf4Quantized q = nf4_quantize(w.data(), n, "w");
  std::vector<uint8_t> buffer(static_cast<size_t>(nf4_bytes(n)), 0xab);
  nf4_quantize(w.data(), n, nf4_view(buffer.data(), n), "w");
  const Nf4ConstView v = nf4_view(buffer.data(), n);
  EXPECT_EQ(std::memcmp(v.absmax_offset, &q.absmax_offset, sizeof(float)), 0);
  EXPECT_EQ(std::vector<float>(v.absmax_scales, v.absmax_scales + nf4_groups(n)), q.absmax_scales);
  EXPECT_EQ(std::vector<uint8_t>(v.codes, v.codes + (n + 1) / 2), q.codes);
  EXPECT_EQ(std::vector<int8_t>(v.absmax_codes, v.absmax_codes + nf4_blocks(n)), q.absmax_codes);
  EXPECT_EQ(v.code(n - 1), q.view().code(n - 1));
  EXPECT_EQ(v.codes[(n - 1) / 2] & 15, 0);  // the unused low nibble of the last byte
  std::vector<float> from_buffer(w.size()), from_vectors(w.size());
  nf4_dequantize(v, from_buffer.data());
  nf4_dequantize(q.view(), from_vectors.data());
  EXPECT_EQ(std::memcmp(from_buffer.data(), from_vectors.data(), w.size() * sizeof(float)), 0);
  // A view of different length is a caller's bug.
  EXPECT_THROW(nf4_quantize(w.data(), n - 1, nf4_view(buffer.data(), n), "w"), Error);
}

}  // namespace
}  // namespace st
