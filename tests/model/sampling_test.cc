// The sampling rule of sampling.h: greedy with ties to the lowest id, the softmax's frequencies at temperatures 1 and
// 2, top-k's candidates, draw i as sample_rows's at draw index i, and the refusals.
#include "shardtrain/model/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/sample.h"

namespace st {
namespace {

SamplingOptions options(double temperature, int64_t top_k, uint64_t seed) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.seed = seed;
  return o;
}

// The frequency of each id over `draws` draws.
std::vector<double> frequencies(const std::vector<float>& logits, const SamplingOptions& o, int draws) {
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) f[static_cast<size_t>(sample_token(logits, o, static_cast<uint64_t>(i)))] += 1.0;
  for (double& x : f) x /= draws;
  return f;
}

TEST(Sampling, GreedyTakesTheLowestIdOfTiedMaxima) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f};
  EXPECT_EQ(argmax_token(logits), 1);
  for (uint64_t draw = 0; draw < 20; ++draw) {
    EXPECT_EQ(sample_token(logits, options(0.0, 0, 3), draw), 1);
    EXPECT_EQ(sample_token(logits, options(1.0, 1, 3), draw), 1);  // top_k 1 is greedy at any temperature
    EXPECT_EQ(sample_token(logits, options(50.0, 1, 3), draw), 1);
  }
}

// p(id) = exp(logit / temperature) / sum: 40000 draws land within 0.01 of it (the sampling error's standard
// deviation is below 0.0025).
TEST(Sampling, FrequenciesFollowTheSoftmaxAtTheTemperature) {
  const std::vector<float> logits = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  const std::vector<double> t1 = frequencies(logits, options(1.0, 0, 7), 40000);
  const double want1[] = {0.1, 0.2, 0.3, 0.4};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(t1[i], want1[i], 0.01) << i;
  // Temperature 2: p proportional to sqrt(1, 2, 3, 4).
  const std::vector<double> t2 = frequencies(logits, options(2.0, 0, 7), 40000);
  const double norm = 1.0 + std::sqrt(2.0) + std::sqrt(3.0) + 2.0;
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(t2[i], std::sqrt(static_cast<double>(i + 1)) / norm, 0.01) << i;
}

// Top-k keeps the k largest logits (ties to the lower id) and renormalises among them.
TEST(Sampling, TopKSamplesAmongTheKLargest) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f, 2.0f};
  const std::vector<double> f = frequencies(logits, options(1.0, 2, 9), 20000);
  EXPECT_NEAR(f[1], 0.5, 0.02);
  EXPECT_NEAR(f[2], 0.5, 0.02);
  EXPECT_EQ(f[0] + f[3] + f[4] + f[5], 0.0);
  // k at or past the vocabulary: every token.
  EXPECT_EQ(frequencies(logits, options(1.0, 6, 9), 5000), frequencies(logits, options(1.0, 0, 9), 5000));
  EXPECT_EQ(frequencies(logits, options(1.0, 60, 9), 5000), frequencies(logits, options(1.0, 0, 9), 5000));
}

// Token i is sample_rows's for the row with draw index i (kernels/sample.h): the rule a GPU decoder follows on the
// device. The draws differ from one index to the next, and the same index draws the same token on every call.
TEST(Sampling, DrawIIsSampleRowsAtDrawIndexI) {
  const std::vector<float> logits = {0.3f, -1.0f, 2.0f, 2.0f, 0.0f, 1.5f, -0.5f};
  for (const SamplingOptions& o : {options(1.0, 0, 42), options(0.7, 3, 42), options(2.0, 0, 5)}) {
    std::vector<int32_t> seen(logits.size(), 0);
    for (uint64_t i = 0; i < 300; ++i) {
      int32_t want = -1;
      sample_rows(logits.data(), 7, 1, 7, &i, o, &want);
      EXPECT_EQ(sample_token(logits, o, i), want) << i;
      seen[static_cast<size_t>(want)] = 1;
    }
    EXPECT_GE(std::count(seen.begin(), seen.end(), 1), o.top_k == 3 ? 3 : 5) << o.temperature << " " << o.top_k;
  }
}

TEST(Sampling, BadOptionsAndLogitsAreRefused) {
  const std::vector<float> logits = {0.0f, 1.0f};
  auto refused = [&](const SamplingOptions& o, const std::vector<float>& l, const std::string& names) {
    try {
      sample_token(l, o, 0);
      ADD_FAILURE() << "accepted: " << names;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      EXPECT_NE(std::string(e.what()).find(names), std::string::npos) << e.what();
    }
  };
  refused(options(-1.0, 0, 0), logits, "temperature");
  refused(options(std::numeric_limits<double>::quiet_NaN(), 0, 0), logits, "temperature");
  refused(options(std::numeric_limits<double>::infinity(), 0, 0), logits, "temperature");
  refused(options(1.0, -2, 0), logits, "top_k");
  refused(options(1.0, 0, 0), {0.0f, std::numeric_limits<float>::quiet_NaN()}, "token 1");
  refused(options(0.0, 0, 0), {std::numeric_limits<float>::infinity(), 0.0f}, "token 0");
}

}  // namespace
}  // namespace st
