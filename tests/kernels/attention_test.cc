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

struct Shape {
  int B, T, C, NH;
  int64_t qkv_size() const { return static_cast<int64_t>(B) * T * 3 * C; }
  int64_t out_size() const { return static_cast<int64_t>(B) * T * C; }
  int64_t att_size() const { return static_cast<int64_t>(B) * NH * T * T; }
};

struct Ref {
  std::vector<double> out, att, dqkv;
};

// Straight from the definition in double, one (b, h, query) at a time.
Ref naive(const Shape& s, const std::vector<float>& qkv, const std::vector<float>& dout) {
  const int hs = s.C / s.NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  Ref r;
  r.out.assign(s.out_size(), 0.0);
  r.att.assign(s.att_size(), 0.0);
  r.dqkv.assign(s.qkv_size(), 0.0);
  auto at = [&](int b, int t, int which, int h, int d) -> int64_t {
    return (static_cast<int64_t>(b) * s.T + t) * 3 * s.C + which * s.C + h * hs + d;
  };
  for (int b = 0; b < s.B; ++b)
    for (int h = 0; h < s.NH; ++h)
      for (int i = 0; i < s.T; ++i) {
        std::vector<double> p(i + 1), dp(i + 1);
        double mx = -1e300;
        for (int j = 0; j <= i; ++j) {
          double d = 0;
          for (int e = 0; e < hs; ++e) d += static_cast<double>(qkv[at(b, i, 0, h, e)]) * qkv[at(b, j, 1, h, e)];
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
          for (int j = 0; j <= i; ++j) r.out[o + e] += p[j] * qkv[at(b, j, 2, h, e)];
        // Backward: dv_j += p_j dout_i; dp_j = dout_i . v_j; ds = p (dp - p.dp); dq_i += scale ds k; dk_j += ...
        double pdp = 0;
        for (int j = 0; j <= i; ++j) {
          dp[j] = 0;
          for (int e = 0; e < hs; ++e) {
            dp[j] += static_cast<double>(dout[o + e]) * qkv[at(b, j, 2, h, e)];
            r.dqkv[at(b, j, 2, h, e)] += p[j] * dout[o + e];
          }
          pdp += p[j] * dp[j];
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - pdp) * scale;
          for (int e = 0; e < hs; ++e) {
            r.dqkv[at(b, i, 0, h, e)] += ds * qkv[at(b, j, 1, h, e)];
            r.dqkv[at(b, j, 1, h, e)] += ds * qkv[at(b, i, 0, h, e)];
          }
        }
      }
  return r;
}

void PrintTo(const Shape& s, std::ostream* os) { *os << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH; }

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

}  // namespace
}  // namespace st
