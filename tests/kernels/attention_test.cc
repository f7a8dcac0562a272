#include "shardtrain/kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "grad_check.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

using testing::max_rel_diff;
using testing::numeric_grad;
using testing::randn;
using testing::weighted_sum;

// C = NH hs is the width of q and of out; NKV = 0 means NH (no grouping: qkv [B,T,3C]).
struct Shape {
  int B, T, C, NH;
  int NKV = 0;
  int kv() const { return NKV > 0 ? NKV : NH; }
  int hs() const { return C / NH; }
  int64_t ld() const { return static_cast<int64_t>(NH + 2 * kv()) * hs(); }  // qkv's row stride
  int64_t qkv_size() const { return static_cast<int64_t>(B) * T * ld(); }
  int64_t out_size() const { return static_cast<int64_t>(B) * T * C; }
  int64_t att_size() const { return static_cast<int64_t>(B) * NH * T * T; }
};

// Grouped-query attention: NH query heads of hs, NKV K/V heads.
Shape gqa(int B, int T, int NH, int NKV, int hs) { return Shape{B, T, NH * hs, NH, NKV}; }

struct Ref {
  std::vector<double> out, att, dqkv;
};

// Straight from the definition in double, one (b, h, query) at a time; query head h reads K/V head h / (NH/NKV).
Ref naive(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int hs = s.hs();
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Ref r;
  r.out.assign(s.out_size(), 0.0);
  r.att.assign(s.att_size(), 0.0);
  r.dqkv.assign(s.qkv_size(), 0.0);
  // Element d of head `head` of q (which = 0, head < NH), k (1) or v (2, head < NKV) at (b, t).
  auto at = [&](int b, int t, int which, int head, int d) -> int64_t {
    const int64_t block = which == 0 ? 0 : s.C + static_cast<int64_t>(which - 1) * s.kv() * hs;
    return (static_cast<int64_t>(b) * s.T + t) * s.ld() + block + head * hs + d;
  };
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int i = 0; i < s.T; ++i) {
        const int kh = h / (s.NH / s.kv());  // the K/V head of query head h
        std::vector<double> p(i + 1), dp(i + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int e = 0; e < hs; ++e) d += static_cast<double>(qkv[at(b, i, 0, h, e)]) * qkv[at(b, j, 1, kh, e)];
          p[j] = d * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - mx));
        for (int j = 0; j <= i; ++j) p[j] /= sum;
        const int64_t att_row = ((static_cast<int64_t>(b) * s.NH + h) * s.T + i) * s.T;
        for (int j = 0; j <= i; ++j) r.att[att_row + j] = p[j];
        const int64_t o = (static_cast<int64_t>(b) * s.T + i) * s.C + h * hs;
        for (int e = 0; e < hs; ++e)
          for (int j = 0; j <= i; ++j) r.out[o + e] += p[j] * qkv[at(b, j, 2, kh, e)];
        // Backward: dv_j += p_j dout_i; dp_j = dout_i . v_j; ds = p (dp - p.dp); dq_i += scale ds k; dk_j += ...
        double pdp = 0;
        for (int j = 0; j <= i; ++j) {
          dp[j] = 0;
          for (int e = 0; e < hs; ++e) {
            dp[j] += static_cast<double>(dout[o + e]) * qkv[at(b, j, 2, kh, e)];
            r.dqkv[at(b, j, 2, kh, e)] += p[j] * dout[o + e];
          }
          pdp += p[j] * dp[j];
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - pdp) * scale;
          for (int e = 0; e < hs; ++e) {
            r.dqkv[at(b, i, 0, h, e)] += ds * qkv[at(b, j, 1, kh, e)];
            r.dqkv[at(b, j, 1, kh, e)] += ds * qkv[at(b, i, 0, h, e)];
          }
        }
      }
  return r;
}

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH << " NKV=" << s.kv();
}

class AttentionShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(AttentionShapes, ForwardMatchesNaiveDouble) {
  const Shape s = GetParam();
  const auto qkv = randn(s.qkv_size(), 600);
  std::vector<float> out(s.out_size()), att(s.att_size(), 7.0f);
  attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  const Ref r = naive(s, qkv, std::vector<float>(s.out_size(), 0.0f));
  EXPECT_LE(max_rel_diff(out, r.out), testing::kRefTol);
  EXPECT_LE(max_rel_diff(att, r.att), testing::kRefTol);
}

TEST_P(AttentionShapes, AttIsCausalAndRowsSumToOne) {
  const Shape s = GetParam();
  const auto qkv = randn(s.qkv_size(), 610, 2.0f);
  std::vector<float> out(s.out_size()), att(s.att_size(), 7.0f);  // stale values must be overwritten
  attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  for (int64_t row = 0; row < static_cast<int64_t>(s.B) * s.NH * s.T; ++row) {
    const int i = static_cast<int>(row % s.T);
    double sum = 0;
    for (int j = 0; j < s.T; ++j) {
      const float p = att[row * s.T + j];
      if (j > i) {
        ASSERT_EQ(p, 0.0f) << "masked entry row " << row << " key " << j;
      } else {
        ASSERT_GE(p, 0.0f);
        sum += p;
      }
    }
    ASSERT_NEAR(sum, 1.0, 1e-6) << "row " << row;
  }
}

TEST_P(AttentionShapes, BackwardMatchesNaiveDouble) {
  const Shape s = GetParam();
  const auto qkv = randn(s.qkv_size(), 620);
  const auto dout = randn(s.out_size(), 621);
  std::vector<float> out(s.out_size()), att(s.att_size()), dqkv(s.qkv_size(), 0.0f);
  attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
  EXPECT_LE(max_rel_diff(dqkv, naive(s, qkv, dout).dqkv), testing::kRefTol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionShapes,
                         // T = 300 spans three query blocks of the kernel (128, 128, 44).
                         ::testing::Values(Shape{2, 5, 12, 3}, Shape{1, 1, 4, 1}, Shape{3, 33, 24, 2},
                                           Shape{2, 70, 64, 4}, Shape{2, 300, 16, 2}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           const Shape& s = info.param;
                           return "B" + std::to_string(s.B) + "T" + std::to_string(s.T) + "C" + std::to_string(s.C) +
                                  "NH" + std::to_string(s.NH);
                         });

TEST(Attention, FutureTokensDoNotChangePastOutputs) {
  const Shape s{2, 6, 12, 3};
  auto qkv = randn(s.qkv_size(), 630);
  std::vector<float> out0(s.out_size()), out1(s.out_size()), att(s.att_size());
  attention_forward(out0.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  // Change q, k and v of the last position of every sequence.
  for (int b = 0; b < s.B; ++b)
    for (int c = 0; c < 3 * s.C; ++c) qkv[(static_cast<int64_t>(b) * s.T + s.T - 1) * 3 * s.C + c] += 5.0f;
  attention_forward(out1.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  for (int b = 0; b < s.B; ++b)
    for (int t = 0; t < s.T; ++t)
      for (int c = 0; c < s.C; ++c) {
        const int64_t i = (static_cast<int64_t>(b) * s.T + t) * s.C + c;
        if (t < s.T - 1) {
          ASSERT_EQ(out0[i], out1[i]) << b << "," << t << "," << c;
        }
      }
  // ... while the last position itself did change.
  const int64_t last = (s.T - 1) * s.C;
  EXPECT_NE(out0[last], out1[last]);
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  const Shape s{2, 5, 12, 3};
  auto qkv = randn(s.qkv_size(), 640);
  const auto R = randn(s.out_size(), 641);
  std::vector<float> out(s.out_size()), att(s.att_size());
  auto loss = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    return weighted_sum(out.data(), R);
  };
  loss();
  std::vector<float> dqkv(s.qkv_size(), 0.0f);
  attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
  const auto fd = numeric_grad(qkv.data(), s.qkv_size(), testing::kFdStep, loss);
  ASSERT_GT(testing::max_abs(fd), 0.1);
  EXPECT_LE(max_rel_diff(dqkv, fd), testing::kFdTol);
  // Each of q, k and v gets a gradient: check the three slices separately so a dead slice cannot hide.
  for (int which = 0; which < 3; ++which) {
    std::vector<double> part_fd;
    std::vector<float> part;
    for (int64_t bt = 0; bt < static_cast<int64_t>(s.B) * s.T; ++bt)
      for (int c = 0; c < s.C; ++c) {
        part_fd.push_back(fd[bt * 3 * s.C + which * s.C + c]);
        part.push_back(dqkv[bt * 3 * s.C + which * s.C + c]);
      }
    ASSERT_GT(testing::max_abs(part_fd), 1e-2) << "slice " << which;
    EXPECT_LE(max_rel_diff(part, part_fd), testing::kFdTol) << "slice " << which;
  }
}

TEST(Attention, BackwardAccumulates) {
  const Shape s{2, 7, 12, 2};
  const auto qkv = randn(s.qkv_size(), 650);
  const auto dout = randn(s.out_size(), 651);
  std::vector<float> out(s.out_size()), att(s.att_size()), once(s.qkv_size(), 0.0f);
  attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
  attention_backward(once.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
  auto g0 = randn(s.qkv_size(), 652);
  auto acc = g0;
  attention_backward(acc.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
  std::vector<double> ref(acc.size());
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = static_cast<double>(g0[i]) + once[i];
  EXPECT_LE(max_rel_diff(acc, ref), 1e-6);
  auto twice = once;
  attention_backward(twice.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
  for (size_t i = 0; i < ref.size(); ++i) ref[i] = 2.0 * once[i];
  EXPECT_LE(max_rel_diff(twice, ref), 1e-6);
}

TEST(Attention, RejectsHeadCountThatDoesNotDivideC) {
  const Shape s{1, 3, 10, 4};
  std::vector<float> qkv(s.qkv_size(), 0.0f), out(s.out_size()), att(s.att_size());
  EXPECT_THROW(attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH), Error);
  EXPECT_THROW(attention_backward(qkv.data(), out.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH), Error);
}

// Grouped-query attention through the (NH, NKV, hs) forms: NKV = 1 (multi-query), 2 and NH (no grouping), over
// one query block and over three (T = 300).
class GqaShapes : public ::testing::TestWithParam<Shape> {};

TEST_P(GqaShapes, ForwardMatchesNaiveDouble) {
  const Shape s = GetParam();
  const auto qkv = randn(s.qkv_size(), 660);
  std::vector<float> out(s.out_size()), att(s.att_size(), 7.0f);
  attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.kv(), s.hs());
  const Ref r = naive(s, qkv, std::vector<float>(s.out_size(), 0.0f));
  EXPECT_LE(max_rel_diff(out, r.out), testing::kRefTol);
  EXPECT_LE(max_rel_diff(att, r.att), testing::kRefTol);
}

TEST_P(GqaShapes, BackwardMatchesNaiveDouble) {
  const Shape s = GetParam();
  const auto qkv = randn(s.qkv_size(), 670);
  const auto dout = randn(s.out_size(), 671);
  std::vector<float> out(s.out_size()), att(s.att_size()), dqkv(s.qkv_size(), 0.0f);
  attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.kv(), s.hs());
  attention_backward(dqkv.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.NH, s.kv(), s.hs());
  EXPECT_LE(max_rel_diff(dqkv, naive(s, qkv, dout).dqkv), testing::kRefTol);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GqaShapes,
                         ::testing::Values(gqa(2, 5, 4, 1, 3), gqa(2, 5, 4, 2, 3), gqa(2, 5, 4, 4, 3),
                                           gqa(1, 33, 6, 1, 8), gqa(3, 33, 6, 2, 8), gqa(1, 70, 8, 2, 16),
                                           gqa(1, 300, 4, 1, 4), gqa(2, 300, 4, 2, 4)),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           const Shape& s = info.param;
                           return "B" + std::to_string(s.B) + "T" + std::to_string(s.T) + "NH" + std::to_string(s.NH) +
                                  "NKV" + std::to_string(s.kv()) + "hs" + std::to_string(s.hs());
                         });

// Each K/V head's gradient sums its query heads: a finite-difference check of every q, k and v slice.
TEST(AttentionGqa, BackwardMatchesFiniteDifferences) {
  const Shape s = gqa(2, 5, 4, 2, 3);
  auto qkv = randn(s.qkv_size(), 680);
  const auto R = randn(s.out_size(), 681);
  std::vector<float> out(s.out_size()), att(s.att_size());
  auto loss = [&] {
    attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.kv(), s.hs());
    return weighted_sum(out.data(), R);
  };
  loss();
  std::vector<float> dqkv(s.qkv_size(), 0.0f);
  attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), s.B, s.T, s.NH, s.kv(), s.hs());
  const auto fd = numeric_grad(qkv.data(), s.qkv_size(), testing::kFdStep, loss);
  const int64_t width[3] = {s.C, static_cast<int64_t>(s.kv()) * s.hs(), static_cast<int64_t>(s.kv()) * s.hs()};
  int64_t first = 0;
  for (int which = 0; which < 3; ++which) {
    std::vector<double> part_fd;
    std::vector<float> part;
    for (int64_t bt = 0; bt < static_cast<int64_t>(s.B) * s.T; ++bt)
      for (int64_t c = first; c < first + width[which]; ++c) {
        part_fd.push_back(fd[bt * s.ld() + c]);
        part.push_back(dqkv[bt * s.ld() + c]);
      }
    ASSERT_GT(testing::max_abs(part_fd), 1e-2) << "slice " << which;
    EXPECT_LE(max_rel_diff(part, part_fd), testing::kFdTol) << "slice " << which;
    first += width[which];
  }
}

// NKV = NH through the grouped forms gives the (C, NH) forms' results bit for bit, accumulation included.
TEST(AttentionGqa, UngroupedEqualsMultiHeadBitForBit) {
  for (const Shape& s : {Shape{2, 5, 12, 3}, Shape{2, 300, 16, 2}, Shape{1, 70, 64, 4}}) {
    SCOPED_TRACE(::testing::PrintToString(s));
    const auto qkv = randn(s.qkv_size(), 690);
    const auto dout = randn(s.out_size(), 691);
    const auto g0 = randn(s.qkv_size(), 692);
    std::vector<float> out_a(s.out_size()), att_a(s.att_size()), out_b(s.out_size()), att_b(s.att_size());
    std::vector<float> dqkv_a = g0, dqkv_b = g0;
    attention_forward(out_a.data(), att_a.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    attention_backward(dqkv_a.data(), dout.data(), qkv.data(), att_a.data(), s.B, s.T, s.C, s.NH);
    attention_forward(out_b.data(), att_b.data(), qkv.data(), s.B, s.T, s.NH, s.NH, s.hs());
    attention_backward(dqkv_b.data(), dout.data(), qkv.data(), att_b.data(), s.B, s.T, s.NH, s.NH, s.hs());
    EXPECT_EQ(std::memcmp(out_a.data(), out_b.data(), out_a.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(att_a.data(), att_b.data(), att_a.size() * sizeof(float)), 0);
    EXPECT_EQ(std::memcmp(dqkv_a.data(), dqkv_b.data(), dqkv_a.size() * sizeof(float)), 0);
  }
}

// A K/V head shared by several query heads: their outputs differ (distinct queries), and a query head's output
// depends only on its own K/V head.
TEST(AttentionGqa, QueryHeadsReadTheirGroupsKvHead) {
  const Shape s = gqa(1, 6, 4, 2, 3);
  auto qkv = randn(s.qkv_size(), 700);
  std::vector<float> out0(s.out_size()), out1(s.out_size()), att(s.att_size());
  attention_forward(out0.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.kv(), s.hs());
  // Change V head 1 (read by query heads 2 and 3) at every position.
  for (int t = 0; t < s.T; ++t)
    for (int d = 0; d < s.hs(); ++d) qkv[t * s.ld() + s.C + (s.kv() + 1) * s.hs() + d] += 1.0f;
  attention_forward(out1.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.kv(), s.hs());
  for (int t = 0; t < s.T; ++t)
    for (int c = 0; c < s.C; ++c) {
      const int64_t i = static_cast<int64_t>(t) * s.C + c;
      if (c < 2 * s.hs()) {
        ASSERT_EQ(out0[i], out1[i]) << "query head " << c / s.hs() << " t " << t;
      } else {
        ASSERT_NEAR(out1[i] - out0[i], 1.0f, 1e-5) << "query head " << c / s.hs() << " t " << t;  // rows sum to 1
      }
    }
}

TEST(AttentionGqa, RejectsQueryHeadsNotAMultipleOfKvHeads) {
  const Shape s = gqa(1, 3, 4, 3, 2);
  std::vector<float> qkv(s.qkv_size(), 0.0f), out(s.out_size()), att(s.att_size());
  EXPECT_THROW(attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.kv(), s.hs()), Error);
  EXPECT_THROW(attention_backward(qkv.data(), out.data(), qkv.data(), att.data(), s.B, s.T, s.NH, s.kv(), s.hs()),
               Error);
}

}  // namespace
}  // namespace st
