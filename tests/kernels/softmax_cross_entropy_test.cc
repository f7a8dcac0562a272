#include "shardtrain/kernels/softmax_cross_entropy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "grad_check.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

using testing::max_rel_diff;
using testing::numeric_grad;
using testing::randn;

struct Case {
  int64_t N;
  int V, Vp;
  std::vector<float> logits;
  std::vector<int32_t> targets;
  Case(int64_t n, int v, int vp, uint64_t stream, float scale = 2.0f) : N(n), V(v), Vp(vp) {
    logits = randn(N * Vp, stream, scale);
    // Padding columns hold values that would dominate (or poison) the result if they entered it.
    for (int64_t r = 0; r < N; ++r)
      for (int i = V; i < Vp; ++i) logits[r * Vp + i] = (i % 2) ? 1e4f : std::numeric_limits<float>::quiet_NaN();
    Rng rng(testing::kSeed, stream + 1);
    targets.resize(N);
    for (auto& t : targets) t = static_cast<int32_t>(rng.next_below(V));
    targets[0] = V - 1;  // the last real column is a valid target
  }
};

struct Ref {
  std::vector<double> losses, dlogits;
};

Ref naive(const Case& k, double dloss) {
  Ref r;
  r.losses.resize(k.N);
  r.dlogits.assign(k.N * k.Vp, 0.0);
  for (int64_t n = 0; n < k.N; ++n) {
    const float* x = k.logits.data() + n * k.Vp;
    double s = 0;
    for (int i = 0; i < k.V; ++i) s += std::exp(static_cast<double>(x[i]));
    r.losses[n] = -(x[k.targets[n]] - std::log(s));  // -log softmax at the target
    for (int i = 0; i < k.V; ++i)
      r.dlogits[n * k.Vp + i] = dloss * (std::exp(static_cast<double>(x[i])) / s - (i == k.targets[n] ? 1.0 : 0.0));
  }
  return r;
}

TEST(SoftmaxCrossEntropy, LossIsMinusLogSoftmaxAtTarget) {
  Case k(7, 11, 16, 500);
  std::vector<float> losses(k.N);
  softmax_cross_entropy(losses.data(), nullptr, k.logits.data(), k.targets.data(), k.N, k.V, k.Vp, 1.0f);
  EXPECT_LE(max_rel_diff(losses, naive(k, 1.0).losses), testing::kRefTol);
}

TEST(SoftmaxCrossEntropy, GradientMatchesNaiveAndPaddingIsExactlyZero) {
  Case k(7, 11, 16, 510);
  const float dloss = 1.0f / 7;
  std::vector<float> losses(k.N), dlogits(k.N * k.Vp, 123.0f);  // stale contents are overwritten
  softmax_cross_entropy(losses.data(), dlogits.data(), k.logits.data(), k.targets.data(), k.N, k.V, k.Vp, dloss);
  const Ref r = naive(k, dloss);
  EXPECT_LE(max_rel_diff(losses, r.losses), testing::kRefTol);
  EXPECT_LE(max_rel_diff(dlogits, r.dlogits), testing::kRefTol);
  for (int64_t n = 0; n < k.N; ++n) {
    double row = 0;
    for (int i = 0; i < k.V; ++i) row += dlogits[n * k.Vp + i];
    EXPECT_NEAR(row, 0.0, 1e-7) << "softmax - onehot sums to 0, row " << n;
    for (int i = k.V; i < k.Vp; ++i) EXPECT_EQ(dlogits[n * k.Vp + i], 0.0f) << n << "," << i;
  }
}

TEST(SoftmaxCrossEntropy, InPlaceEqualsOutOfPlace) {
  Case k(5, 13, 17, 520);
  const float dloss = 0.37f;
  std::vector<float> losses(k.N), dlogits(k.N * k.Vp);
  softmax_cross_entropy(losses.data(), dlogits.data(), k.logits.data(), k.targets.data(), k.N, k.V, k.Vp, dloss);
  auto inplace = k.logits;
  std::vector<float> losses2(k.N);
  softmax_cross_entropy(losses2.data(), inplace.data(), inplace.data(), k.targets.data(), k.N, k.V, k.Vp, dloss);
  EXPECT_EQ(0, std::memcmp(losses.data(), losses2.data(), losses.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dlogits.data(), inplace.data(), dlogits.size() * sizeof(float)));
  // Losses without a gradient are the same numbers.
  std::vector<float> losses3(k.N);
  softmax_cross_entropy(losses3.data(), nullptr, k.logits.data(), k.targets.data(), k.N, k.V, k.Vp, dloss);
  EXPECT_EQ(0, std::memcmp(losses.data(), losses3.data(), losses.size() * sizeof(float)));
}

TEST(SoftmaxCrossEntropy, GradientMatchesFiniteDifferences) {
  Case k(7, 11, 14, 530);
  const float dloss = 0.37f;
  std::vector<float> losses(k.N);
  // L = dloss * sum_n losses[n]: dlogits is exactly dL/dlogits.
  auto loss = [&] {
    softmax_cross_entropy(losses.data(), nullptr, k.logits.data(), k.targets.data(), k.N, k.V, k.Vp, dloss);
    double s = 0;
    for (float l : losses) s += l;
    return dloss * s;
  };
  std::vector<float> dlogits(k.N * k.Vp);
  softmax_cross_entropy(losses.data(), dlogits.data(), k.logits.data(), k.targets.data(), k.N, k.V, k.Vp, dloss);
  // Perturb real columns only: the padding holds NaN/1e4 by construction and has no gradient.
  std::vector<double> fd(k.N * k.Vp, 0.0);
  for (int64_t n = 0; n < k.N; ++n) {
    const auto row = numeric_grad(k.logits.data() + n * k.Vp, k.V, testing::kFdStep, loss);
    for (int i = 0; i < k.V; ++i) fd[n * k.Vp + i] = row[i];
  }
  ASSERT_GT(testing::max_abs(fd), 0.1);
  EXPECT_LE(max_rel_diff(dlogits, fd), testing::kFdTol);
}

TEST(SoftmaxCrossEntropy, StableForLargeLogits) {
  // exp(1000) overflows float and double: only a max-shifted softmax gets these right.
  Case k(3, 6, 8, 540, 1.0f);
  Case shifted = k;
  for (int64_t n = 0; n < k.N; ++n)
    for (int i = 0; i < k.V; ++i) shifted.logits[n * k.Vp + i] += 1000.0f;
  std::vector<float> l0(k.N), l1(k.N), d1(k.N * k.Vp);
  softmax_cross_entropy(l0.data(), nullptr, k.logits.data(), k.targets.data(), k.N, k.V, k.Vp, 1.0f);
  softmax_cross_entropy(l1.data(), d1.data(), shifted.logits.data(), k.targets.data(), k.N, k.V, k.Vp, 1.0f);
  const Ref r = naive(k, 1.0);  // the unshifted problem has the same softmax
  // 1000 + x in float keeps ~6e-5 absolute resolution of x, which bounds the agreement.
  for (int64_t n = 0; n < k.N; ++n) EXPECT_NEAR(l1[n], r.losses[n], 2e-4) << n;
  EXPECT_LE(max_rel_diff(d1, r.dlogits), 2e-4);
  for (float v : d1) EXPECT_TRUE(std::isfinite(v));
}

TEST(SoftmaxCrossEntropy, UniformLogitsGiveLogV) {
  const int64_t N = 4;
  const int V = 50257, Vp = 50304;  // GPT-2's vocabulary and its padded size
  std::vector<float> logits(N * Vp, 0.5f), losses(N), dlogits(N * Vp);
  std::vector<int32_t> targets = {0, 1, 50256, 777};
  softmax_cross_entropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, Vp, 1.0f);
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_NEAR(losses[n], std::log(static_cast<double>(V)), 1e-5);
    EXPECT_NEAR(dlogits[n * Vp + targets[n]], 1.0 / V - 1.0, 1e-6);
    EXPECT_EQ(dlogits[n * Vp + V], 0.0f);
    EXPECT_EQ(dlogits[n * Vp + Vp - 1], 0.0f);
  }
}

TEST(SoftmaxCrossEntropy, RejectsTargetOutsideRealVocabulary) {
  Case k(3, 6, 8, 550);
  std::vector<float> losses(k.N, -1.0f);
  k.targets[2] = 6;  // == V: a padding column, not a class
  EXPECT_THROW(softmax_cross_entropy(losses.data(), nullptr, k.logits.data(), k.targets.data(), k.N, k.V, k.Vp, 1.0f),
               Error);
  EXPECT_EQ(losses[0], -1.0f);  // nothing written before the check
}

// A target < 0 is not a target: loss 0 and a dlogits row of exact zeros (padding included), in place or not; the
// other rows are what they are without the ignored ones, bit for bit.
TEST(SoftmaxCrossEntropy, NegativeTargetsAreIgnoredRows) {
  Case k(9, 11, 16, 560);
  Case kept = k;
  const std::vector<int64_t> ignored = {0, 3, 4, 8};
  for (int64_t n : ignored) k.targets[n] = n == 4 ? -100 : -1;  // any negative value, -100 as PyTorch's default
  const float dloss = 0.37f;
  std::vector<float> losses(k.N, -5.0f), dlogits(k.N * k.Vp, 123.0f);
  softmax_cross_entropy(losses.data(), dlogits.data(), k.logits.data(), k.targets.data(), k.N, k.V, k.Vp, dloss);
  std::vector<float> all_losses(k.N), all_dlogits(k.N * k.Vp);
  softmax_cross_entropy(all_losses.data(), all_dlogits.data(), kept.logits.data(), kept.targets.data(), k.N, k.V, k.Vp,
                        dloss);
  for (int64_t n = 0; n < k.N; ++n) {
    const bool skip = std::find(ignored.begin(), ignored.end(), n) != ignored.end();
    EXPECT_EQ(losses[n], skip ? 0.0f : all_losses[n]) << "row " << n;
    for (int i = 0; i < k.Vp; ++i)
      EXPECT_EQ(dlogits[n * k.Vp + i], skip ? 0.0f : all_dlogits[n * k.Vp + i]) << "row " << n << " col " << i;
  }
  // In place: the same bits; the ignored rows' logits (NaN padding included) become zeros.
  auto inplace = k.logits;
  std::vector<float> losses2(k.N);
  softmax_cross_entropy(losses2.data(), inplace.data(), inplace.data(), k.targets.data(), k.N, k.V, k.Vp, dloss);
  EXPECT_EQ(0, std::memcmp(losses.data(), losses2.data(), losses.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(dlogits.data(), inplace.data(), dlogits.size() * sizeof(float)));
  // Every row ignored.
  std::vector<int32_t> none(k.N, -1);
  softmax_cross_entropy(losses.data(), dlogits.data(), k.logits.data(), none.data(), k.N, k.V, k.Vp, dloss);
  EXPECT_EQ(std::count(losses.begin(), losses.end(), 0.0f), k.N);
  EXPECT_EQ(std::count(dlogits.begin(), dlogits.end(), 0.0f), k.N * k.Vp);
}

}  // namespace
}  // namespace st
