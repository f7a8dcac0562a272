#include "shardtrain/kernels/embedding.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "grad_check.h"

namespace st {
namespace {

using testing::max_rel_diff;
using testing::numeric_grad;
using testing::randn;
using testing::weighted_sum;

struct Case {
  int B, T, C, Vp;
  std::vector<int32_t> tokens;
  std::vector<float> wte, wpe;
  Case(int b, int t, int c, int vp, int wpe_rows, int vocab_used, uint64_t stream) : B(b), T(t), C(c), Vp(vp) {
    Rng rng(testing::kSeed, stream);
    tokens.resize(static_cast<size_t>(B) * T);
    for (auto& tok : tokens) tok = static_cast<int32_t>(rng.next_below(vocab_used));
    wte = randn(static_cast<int64_t>(Vp) * C, stream + 1);
    wpe = randn(static_cast<int64_t>(wpe_rows) * C, stream + 2);
  }
};

TEST(Embedding, ForwardIsTokenRowPlusPositionRow) {
  Case k(2, 5, 12, 11, 8, 11, 400);  // wpe has more rows than T
  std::vector<float> out(k.B * k.T * k.C);
  embedding_forward(out.data(), k.tokens.data(), k.wte.data(), k.wpe.data(), k.B, k.T, k.C);
  // One float add per element: bitwise equal to the obvious loop.
  for (int b = 0; b < k.B; ++b)
    for (int t = 0; t < k.T; ++t)
      for (int c = 0; c < k.C; ++c)
        ASSERT_EQ(out[(b * k.T + t) * k.C + c], k.wte[k.tokens[b * k.T + t] * k.C + c] + k.wpe[t * k.C + c])
            << b << "," << t << "," << c;
}

// wpe / dwpe null (no position embedding, llama): out is the token's row, and dwte is what it is with a position
// embedding (its sums do not involve dwpe).
TEST(Embedding, WithoutPositionEmbedding) {
  Case k(2, 5, 12, 11, 5, 4, 420);
  std::vector<float> out(k.B * k.T * k.C);
  embedding_forward(out.data(), k.tokens.data(), k.wte.data(), nullptr, k.B, k.T, k.C);
  for (int bt = 0; bt < k.B * k.T; ++bt)
    for (int c = 0; c < k.C; ++c) ASSERT_EQ(out[bt * k.C + c], k.wte[k.tokens[bt] * k.C + c]) << bt << "," << c;

  const auto dout = randn(k.B * k.T * k.C, 421);
  std::vector<float> dwte(k.Vp * k.C, 0.0f), with_wpe(k.Vp * k.C, 0.0f), dwpe(k.T * k.C, 0.0f);
  embedding_backward(dwte.data(), nullptr, dout.data(), k.tokens.data(), k.B, k.T, k.C);
  embedding_backward(with_wpe.data(), dwpe.data(), dout.data(), k.tokens.data(), k.B, k.T, k.C);
  EXPECT_EQ(0, std::memcmp(dwte.data(), with_wpe.data(), dwte.size() * sizeof(float)));
  EXPECT_NE(dwte[k.tokens[0] * k.C], 0.0f);
}

TEST(Embedding, BackwardMatchesNaiveDouble) {
  Case k(3, 7, 9, 13, 7, 4, 410);  // only 4 distinct tokens in 21 positions: many repeats
  const auto dout = randn(k.B * k.T * k.C, 411);
  std::vector<float> dwte(k.Vp * k.C, 0.0f), dwpe(k.T * k.C, 0.0f);
  embedding_backward(dwte.data(), dwpe.data(), dout.data(), k.tokens.data(), k.B, k.T, k.C);
  std::vector<double> rwte(k.Vp * k.C, 0.0), rwpe(k.T * k.C, 0.0);
  for (int b = 0; b < k.B; ++b)
    for (int t = 0; t < k.T; ++t)
      for (int c = 0; c < k.C; ++c) {
        rwte[k.tokens[b * k.T + t] * k.C + c] += dout[(b * k.T + t) * k.C + c];
        rwpe[t * k.C + c] += dout[(b * k.T + t) * k.C + c];
      }
  EXPECT_LE(max_rel_diff(dwte, rwte), 1e-6);
  EXPECT_LE(max_rel_diff(dwpe, rwpe), 1e-6);
  // Rows of tokens that never occur stay exactly zero.
  for (int v = 4; v < k.Vp; ++v)
    for (int c = 0; c < k.C; ++c) EXPECT_EQ(dwte[v * k.C + c], 0.0f);
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  Case k(2, 5, 12, 9, 6, 6, 420);  // Vp > used vocab, wpe rows > T
  const auto R = randn(k.B * k.T * k.C, 421);
  std::vector<float> out(k.B * k.T * k.C);
  auto loss = [&] {
    embedding_forward(out.data(), k.tokens.data(), k.wte.data(), k.wpe.data(), k.B, k.T, k.C);
    return weighted_sum(out.data(), R);
  };
  std::vector<float> dwte(k.wte.size(), 0.0f), dwpe(k.wpe.size(), 0.0f);
  embedding_backward(dwte.data(), dwpe.data(), R.data(), k.tokens.data(), k.B, k.T, k.C);
  const auto fd_wte = numeric_grad(k.wte.data(), static_cast<int64_t>(k.wte.size()), testing::kFdStep, loss);
  const auto fd_wpe = numeric_grad(k.wpe.data(), static_cast<int64_t>(k.wpe.size()), testing::kFdStep, loss);
  ASSERT_GT(testing::max_abs(fd_wte), 0.1);
  EXPECT_LE(max_rel_diff(dwte, fd_wte), testing::kFdTol);
  EXPECT_LE(max_rel_diff(dwpe, fd_wpe), testing::kFdTol);
}

TEST(Embedding, BackwardAccumulatesIntoExistingGradients) {
  Case k(2, 6, 10, 7, 6, 7, 430);
  const auto dout = randn(k.B * k.T * k.C, 431);
  std::vector<float> dwte(k.Vp * k.C, 0.0f), dwpe(k.T * k.C, 0.0f);
  embedding_backward(dwte.data(), dwpe.data(), dout.data(), k.tokens.data(), k.B, k.T, k.C);
  auto acc_wte = dwte, acc_wpe = dwpe;
  embedding_backward(acc_wte.data(), acc_wpe.data(), dout.data(), k.tokens.data(), k.B, k.T, k.C);
  // Twice the gradient, up to the rounding of adding the second pass term by term into the first.
  std::vector<double> twice_wte(dwte.size()), twice_wpe(dwpe.size());
  for (size_t i = 0; i < dwte.size(); ++i) twice_wte[i] = 2.0 * dwte[i];
  for (size_t i = 0; i < dwpe.size(); ++i) twice_wpe[i] = 2.0 * dwpe[i];
  EXPECT_LE(max_rel_diff(acc_wte, twice_wte), 1e-6);
  EXPECT_LE(max_rel_diff(acc_wpe, twice_wpe), 1e-6);
}

TEST(Embedding, BackwardDeterministicAcrossThreadCounts) {
  // Many repeats of 3 tokens over B*T = 512 positions and C spanning several column blocks.
  // B*T*C is well above the size below which the kernels stay serial (src/kernels/parallel.h).
  Case k(8, 64, 100, 5, 64, 3, 440);
  const auto dout = randn(k.B * k.T * k.C, 441);
  auto run = [&](int threads) {
    std::vector<float> dwte(k.Vp * k.C, 0.0f), dwpe(k.T * k.C, 0.0f);
    testing::with_threads(
        threads, [&] { embedding_backward(dwte.data(), dwpe.data(), dout.data(), k.tokens.data(), k.B, k.T, k.C); });
    dwte.insert(dwte.end(), dwpe.begin(), dwpe.end());
    return dwte;
  };
  const auto g1 = run(1), g2 = run(2), g4 = run(4);
  EXPECT_EQ(0, std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(g1.data(), g4.data(), g1.size() * sizeof(float)));
}

}  // namespace
}  // namespace st
