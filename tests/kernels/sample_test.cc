// sample_rows against its definition (kernels/sample.h): the noise is -log(-log(u)) of the draw's uniform; the tokens'
// frequencies follow softmax(logits / temperature) (a chi-square bound over fixed draws), over the top_k candidates
// only; a low temperature concentrates on the argmax, ties going to the lower id; a row's token depends on its logits,
// the seed and its draw index alone; a row with a NaN or an infinity gets -1.
#include "shardtrain/kernels/sample.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "shardtrain/core/rng.h"

namespace st {
namespace {

// The tokens of `draws` rows, each a copy of `logits`, row r with draw index first + r.
std::vector<int32_t> draw_tokens(const std::vector<float>& logits, const SamplingOptions& o, int draws,
                                 uint64_t first = 0) {
  const int V = static_cast<int>(logits.size());
  std::vector<float> rows;
  for (int r = 0; r < draws; ++r) rows.insert(rows.end(), logits.begin(), logits.end());
  std::vector<uint64_t> index(static_cast<size_t>(draws));
  for (int r = 0; r < draws; ++r) index[static_cast<size_t>(r)] = first + static_cast<uint64_t>(r);
  std::vector<int32_t> tokens(static_cast<size_t>(draws));
  sample_rows(rows.data(), V, draws, V, index.data(), o, tokens.data());
  return tokens;
}

// Pearson's chi-square of the tokens' counts against p (ids with p = 0 must not occur: they count as infinite).
double chi_square(const std::vector<int32_t>& tokens, const std::vector<double>& p) {
  std::vector<double> count(p.size(), 0.0);
  for (int32_t t : tokens) count.at(static_cast<size_t>(t)) += 1.0;
  double chi2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double expected = p[i] * static_cast<double>(tokens.size());
    if (expected == 0) {
      if (count[i] > 0) return INFINITY;
      continue;
    }
    chi2 += (count[i] - expected) * (count[i] - expected) / expected;
  }
  return chi2;
}

// softmax(logits / temperature) over the ids in `candidates` (every id when empty).
std::vector<double> softmax(const std::vector<float>& logits, double temperature, const std::vector<int>& candidates) {
  std::vector<double> p(logits.size(), 0.0);
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!candidates.empty() && std::find(candidates.begin(), candidates.end(), static_cast<int>(i)) == candidates.end())
      continue;
    total += (p[i] = std::exp(logits[i] / temperature));
  }
  for (double& x : p) x /= total;
  return p;
}

// The chi-square's 0.1% critical values for 3 and 5 degrees of freedom: a correct sampler exceeds them once in a
// thousand seeds; the draws here are fixed, so the test is deterministic.
constexpr double kChi2Dof3 = 16.27, kChi2Dof5 = 20.52;

TEST(SampleNoise, IsMinusLogMinusLogOfTheDrawsUniform) {
  double lo = INFINITY, hi = -INFINITY, worst = 0;
  for (uint64_t i = 0; i < 200000; ++i) {
    const double u =
        (static_cast<double>(random_bits_at(9, kSampleStream, i) >> 12) + 0.5) * (1.0 / 4503599627370496.0);
    const double g = sample_noise(9, i);
    worst = std::max(worst, std::fabs(g - -std::log(-std::log(u))));
    lo = std::min(lo, g);
    hi = std::max(hi, g);
  }
  EXPECT_LT(worst, 1e-14);  // against libm's log: a few ulp of values below 37 (measured 1.8e-15)
  EXPECT_GE(lo, -3.61);
  EXPECT_LE(hi, 36.74);
  EXPECT_LT(lo, -2.0);  // the draws reach into both tails
  EXPECT_GT(hi, 9.0);
}

// 60000 draws of six tokens at temperatures 1 and 2: chi-square against the softmax below the 0.1% critical value.
TEST(SampleRows, FrequenciesFollowTheSoftmaxAtTheTemperature) {
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f), -1.0f, 0.5f};
  for (double temperature : {1.0, 2.0, 0.5}) {
    const double chi2 =
        chi_square(draw_tokens(logits, SamplingOptions{temperature, 0, 7}, 60000), softmax(logits, temperature, {}));
    EXPECT_LT(chi2, kChi2Dof5) << "temperature " << temperature;
  }
  // A wrong temperature is far off: the test tells them apart.
  EXPECT_GT(chi_square(draw_tokens(logits, SamplingOptions{1.0, 0, 7}, 60000), softmax(logits, 1.2, {})), 100.0);
}

// Top-k samples among the k largest logits, ties to the lower id, renormalised among them; k at or past the vocabulary
// is every token, draw for draw.
TEST(SampleRows, TopKSamplesAmongTheKLargest) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f, 2.0f};
  const std::vector<int32_t> two = draw_tokens(logits, SamplingOptions{1.0, 2, 9}, 20000);
  EXPECT_LT(chi_square(two, softmax(logits, 1.0, {1, 2})), 10.83);  // 1 degree of freedom
  const std::vector<int32_t> four = draw_tokens(logits, SamplingOptions{1.5, 4, 9}, 40000);
  EXPECT_LT(chi_square(four, softmax(logits, 1.5, {1, 2, 4, 5})), kChi2Dof3);
  const std::vector<int32_t> every = draw_tokens(logits, SamplingOptions{1.0, 0, 9}, 5000);
  EXPECT_EQ(draw_tokens(logits, SamplingOptions{1.0, 6, 9}, 5000), every);
  EXPECT_EQ(draw_tokens(logits, SamplingOptions{1.0, 60, 9}, 5000), every);
  // -0 and +0 are equal logits: top-1 is the lower id at any temperature, top-2 either.
  const std::vector<float> zeros = {-1.0f, -0.0f, 0.0f, -2.0f};
  for (int32_t t : draw_tokens(zeros, SamplingOptions{50.0, 1, 3}, 2000)) ASSERT_EQ(t, 1);
  const std::vector<int32_t> pair = draw_tokens(zeros, SamplingOptions{1.0, 2, 3}, 2000);
  EXPECT_EQ(std::count(pair.begin(), pair.end(), 0) + std::count(pair.begin(), pair.end(), 3), 0);
  EXPECT_GT(std::count(pair.begin(), pair.end(), 1), 900);
  EXPECT_GT(std::count(pair.begin(), pair.end(), 2), 900);
}

// A low temperature concentrates on the argmax: at 0.02 a logit 0.5 below it wins with probability e^-25. A
// temperature so low that logit + temperature * noise rounds to the logit leaves ties, which go to the lower id.
TEST(SampleRows, ALowTemperatureTakesTheArgmaxWithTiesToTheLowerId) {
  const std::vector<float> logits = {0.0f, 1.0f, 0.5f, 2.0f, 1.5f};
  for (int32_t t : draw_tokens(logits, SamplingOptions{0.02, 0, 5}, 10000)) ASSERT_EQ(t, 3);
  const std::vector<float> tied = {1.0f, 3.0f, -2.0f, 3.0f, 3.0f};
  for (int32_t t : draw_tokens(tied, SamplingOptions{1e-30, 0, 5}, 1000)) ASSERT_EQ(t, 1);
  // At temperature 1 the three tied logits share the draws.
  const std::vector<int32_t> warm = draw_tokens(tied, SamplingOptions{1.0, 0, 5}, 30000);
  for (int32_t id : {1, 3, 4}) EXPECT_NEAR(std::count(warm.begin(), warm.end(), id) / 30000.0, 0.33, 0.02) << id;
}

// Row r's token is a function of its logits, the seed and draws[r] alone: the same draw in another batch, at another
// row, gives the same token; with two equal logits it is the one with the larger noise at draws[r] * 2 + id.
TEST(SampleRows, ARowsTokenIsAFunctionOfItsDrawIndex) {
  const std::vector<float> pair = {0.25f, 0.25f};
  const std::vector<int32_t> tokens = draw_tokens(pair, SamplingOptions{1.0, 0, 42}, 200, 1000);
  int zeros = 0;
  for (uint64_t d = 0; d < 200; ++d) {
    const uint64_t draw = 1000 + d;
    const int want = 0.25 + sample_noise(42, 2 * draw) >= 0.25 + sample_noise(42, 2 * draw + 1) ? 0 : 1;
    EXPECT_EQ(tokens[static_cast<size_t>(d)], want) << d;
    zeros += want == 0;
    // Alone, as the only row of a call.
    EXPECT_EQ(draw_tokens(pair, SamplingOptions{1.0, 0, 42}, 1, draw).at(0), want) << d;
  }
  EXPECT_GT(zeros, 70);
  EXPECT_LT(zeros, 130);
  // Another seed draws other tokens.
  EXPECT_NE(draw_tokens(pair, SamplingOptions{1.0, 0, 43}, 200, 1000), tokens);
}

// NaN, +inf or -inf anywhere in a row (the padding past V aside) make its token -1 whatever the options; the other
// rows keep theirs.
TEST(SampleRows, ANonFiniteLogitGivesMinusOne) {
  const int V = 5, ld = 7;
  std::vector<float> rows(4 * ld, 0.5f);
  rows[1 * ld + 4] = std::numeric_limits<float>::quiet_NaN();
  rows[2 * ld + 0] = std::numeric_limits<float>::infinity();
  rows[3 * ld + 2] = -std::numeric_limits<float>::infinity();
  rows[0 * ld + 1] = 9.0f;
  rows[0 * ld + 6] = std::numeric_limits<float>::quiet_NaN();  // padding: not read
  const std::vector<uint64_t> draws = {3, 4, 5, 6};
  for (const SamplingOptions& o :
       {SamplingOptions{1.0, 0, 1}, SamplingOptions{0.1, 2, 1}, SamplingOptions{1.0, 1, 1}}) {
    std::vector<int32_t> tokens(4, 99);
    sample_rows(rows.data(), ld, 4, V, draws.data(), o, tokens.data());
    EXPECT_EQ(tokens, (std::vector<int32_t>{1, -1, -1, -1})) << o.temperature << " " << o.top_k;
  }
}

}  // namespace
}  // namespace st
