// The FP8 casts (kernels/fp8.h) against a brute-force reference written here: every code's value from the formats'
// definitions, and the nearest finite code to a value found by searching all 256 codes, ties to the even code,
// saturated at the largest finite value. Checked on every code's value, every midpoint between neighbouring codes and
// the floats beside it, subnormals of both the format and float, random values over 40 binades, values past the
// largest finite one; non-finite inputs are refused; scales map a tensor's largest magnitude onto the format's; a
// transposed cast writes the same codes at the transposed places; the groups' maxima are their largest magnitudes.
#include "shardtrain/kernels/fp8.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "../common/snr.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/matmul.h"

namespace st {
namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::kE4M3, Fp8Format::kE5M2};

// The value of a code from the format's definition (exponent bits, bias, mantissa bits), NaN for non-finite codes.
double reference_value(uint8_t code, Fp8Format f) {
  const int man_bits = f == Fp8Format::kE4M3 ? 3 : 2, bias = f == Fp8Format::kE4M3 ? 7 : 15;
  const int e = (code & 0x7F) >> man_bits, m = code & ((1 << man_bits) - 1);
  const int e_max = (1 << (7 - man_bits)) - 1;
  if (f == Fp8Format::kE4M3 && e == e_max && m == (1 << man_bits) - 1) return NAN;
  if (f == Fp8Format::kE5M2 && e == e_max) return NAN;  // infinities and NaNs: never a cast's result here
  const double mag = e == 0 ? std::ldexp(m, 1 - bias - man_bits) : std::ldexp(m + (1 << man_bits), e - bias - man_bits);
  return (code & 0x80) ? -mag : mag;
}

// The finite code nearest to x, ties to the even code, |x| past the largest finite value saturated to it.
uint8_t reference_encode(float x, Fp8Format f) {
  int best = -1;
  double best_d = INFINITY;
  for (int c = 0; c < 256; ++c) {
    const double v = reference_value(static_cast<uint8_t>(c), f);
    if (std::isnan(v) || std::signbit(v) != std::signbit(x)) continue;
    const double d = std::fabs(v - static_cast<double>(x));
    if (d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
  }
  return static_cast<uint8_t>(best);
}

TEST(Fp8, CodesDecodeToTheFormatsValues) {
  for (Fp8Format f : kFormats)
    for (int c = 0; c < 256; ++c) {
      const double want = reference_value(static_cast<uint8_t>(c), f);
      const float got = fp8_decode(static_cast<uint8_t>(c), f);
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(got) || std::isinf(got)) << to_string(f) << " code " << c;
      else
        EXPECT_EQ(static_cast<double>(got), want) << to_string(f) << " code " << c;
    }
  EXPECT_EQ(fp8_decode(0x7E, Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(fp8_decode(0x38, Fp8Format::kE4M3), 1.0f);
  EXPECT_EQ(fp8_decode(0x01, Fp8Format::kE4M3), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(fp8_decode(0xFF, Fp8Format::kE4M3)));
  EXPECT_EQ(fp8_decode(0x7B, Fp8Format::kE5M2), 57344.0f);
  EXPECT_EQ(fp8_decode(0x3C, Fp8Format::kE5M2), 1.0f);
  EXPECT_EQ(fp8_decode(0x01, Fp8Format::kE5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(fp8_decode(0x7C, Fp8Format::kE5M2), INFINITY);
  EXPECT_EQ(fp8_max(Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Format::kE5M2), 57344.0f);
}

// Every value a code holds, every midpoint between neighbours (a tie: the even code wins) and the floats just beside
// each midpoint (no tie: the nearer code).
TEST(Fp8, CastsRoundToNearestEvenAtEveryCodeAndMidpoint) {
  for (Fp8Format f : kFormats) {
    std::vector<float> values;
    for (int c = 0; c < 128; ++c) {
      const double v = reference_value(static_cast<uint8_t>(c), f),
                   next = reference_value(static_cast<uint8_t>(c + 1), f);
      if (std::isnan(v)) continue;
      values.push_back(static_cast<float>(v));
      if (std::isnan(next) || c + 1 >= 128) continue;
      const float mid = static_cast<float>((v + next) / 2);  // exact: a few bits past the code's mantissa
      values.insert(values.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)});
    }
    int ties = 0;
    for (float v : values)
      for (float x : {v, -v}) {
        EXPECT_EQ(fp8_encode(x, f), reference_encode(x, f)) << to_string(f) << " x " << x;
        ties += fp8_decode(fp8_encode(x, f), f) != x && std::fabs(x) < fp8_max(f) ? 1 : 0;
      }
    EXPECT_GT(ties, 200) << "the midpoints were cast";
  }
}

// Random magnitudes over 2^-30 .. 2^20 (the format's and float's subnormals, past the largest finite value), both
// signs.
TEST(Fp8, CastsRandomValuesAsTheReferenceAndSaturates) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> log2_mag(-30.0, 20.0);
  for (Fp8Format f : kFormats) {
    for (int i = 0; i < 20000; ++i) {
      const float x = static_cast<float>(std::exp2(log2_mag(rng)) * (i % 2 ? -1 : 1));
      ASSERT_EQ(fp8_encode(x, f), reference_encode(x, f)) << to_string(f) << " x " << x;
    }
    const uint8_t max_code = f == Fp8Format::kE4M3 ? 0x7E : 0x7B;
    for (float big : {fp8_max(f) * 1.01f, 1e30f, std::numeric_limits<float>::max()}) {
      EXPECT_EQ(fp8_encode(big, f), max_code) << to_string(f);
      EXPECT_EQ(fp8_encode(-big, f), 0x80 | max_code) << to_string(f);
    }
    EXPECT_EQ(fp8_encode(std::numeric_limits<float>::denorm_min(), f), 0);
    EXPECT_EQ(fp8_encode(-0.0f, f), 0x80);
  }
  EXPECT_EQ(fp8_encode(464.0f, Fp8Format::kE4M3), 0x7E);  // the midpoint to E4M3's NaN code saturates
}

TEST(Fp8, ScaledCastsRefuseNonFiniteValuesAndMapTheLargestMagnitudeToTheMax) {
  for (Fp8Format f : kFormats) {
    const std::vector<float> x = {0.5f, -3.25f, 0.001f, 2.0f};
    const float s = fp8_scale(3.25f, f);
    std::vector<uint8_t> q(4);
    float inverse = 0.0f;
    fp8_quantize_matrix(x.data(), 1, 4, f, Fp8Scaling::kTensor, false, Fp8Layout::kRowMajor, q.data(), &inverse, "t");
    EXPECT_EQ(fp8_decode(q[1], f), -fp8_max(f)) << to_string(f);
    EXPECT_EQ(inverse, 1.0f / s);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(q[static_cast<size_t>(i)], fp8_encode(x[static_cast<size_t>(i)] * s, f));
    // An amax of 0: a finite scale, every code 0.
    const std::vector<float> zeros(3, 0.0f);
    EXPECT_TRUE(std::isfinite(fp8_scale(0.0f, f)));
    fp8_quantize_matrix(zeros.data(), 3, 1, f, Fp8Scaling::kTensor, false, Fp8Layout::kRowMajor, q.data(), &inverse,
                        "zeros");
    EXPECT_EQ(q[0] | q[1] | q[2], 0);
    EXPECT_GT(inverse, 0.0f);
    // Power-of-two scales: a power of two in (scale / 2, scale].
    const float p = fp8_scale(3.25f, f, /*power_of_2=*/true);
    int e = 0;
    EXPECT_EQ(std::frexp(p, &e), 0.5f);
    EXPECT_LE(p, s);
    EXPECT_GT(2 * p, s);
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      const std::vector<float> y = {1.0f, bad};
      try {
        fp8_quantize_matrix(y.data(), 1, 2, f, Fp8Scaling::kTensor, false, Fp8Layout::kRowMajor, q.data(), &inverse,
                            "block.2 mlp.fc input");
        ADD_FAILURE() << "accepted " << bad;
      } catch (const Error& err) {
        EXPECT_EQ(err.kind(), ErrorKind::kBadInput);
        EXPECT_NE(std::string(err.what()).find("block.2 mlp.fc input: element 1 is"), std::string::npos) << err.what();
      }
    }
  }
}

std::vector<float> normal(int64_t n, double sigma, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, sigma);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = static_cast<float>(d(rng));
  return v;
}

// Rows (or columns) six orders of magnitude apart: one tensorwise scale flushes the small ones to zero, a scale per
// row keeps them. Every element is its group's cast.
TEST(Fp8, RoundTripsScaleEachGroupOnItsOwn) {
  const int64_t rows = 4, cols = 64;
  std::vector<float> x = normal(rows * cols, 1.0, 3);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      x[static_cast<size_t>(r * cols + c)] *= static_cast<float>(std::pow(10.0, -2 * r));
  std::vector<float> xt(x.size());  // the transpose, for per-column scales
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) xt[static_cast<size_t>(c * rows + r)] = x[static_cast<size_t>(r * cols + c)];
  const auto row_of = [&](const std::vector<float>& v, int64_t r) {
    return std::vector<float>(v.begin() + r * cols, v.begin() + (r + 1) * cols);
  };
  std::vector<float> tensor(x.size()), row(x.size()), column(x.size());
  fp8_round_trip(x.data(), rows, cols, Fp8Format::kE4M3, Fp8Scaling::kTensor, false, tensor.data(), "x");
  fp8_round_trip(x.data(), rows, cols, Fp8Format::kE4M3, Fp8Scaling::kRow, false, row.data(), "x");
  fp8_round_trip(xt.data(), cols, rows, Fp8Format::kE4M3, Fp8Scaling::kColumn, false, column.data(), "xt");
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float> ref = row_of(x, r);
    EXPECT_GT(testing::snr_db(ref, row_of(row, r)), 28.0) << "row " << r;
    float amax = 0.0f;
    for (float v : ref) amax = std::max(amax, std::fabs(v));
    const float s = fp8_scale(amax, Fp8Format::kE4M3);
    for (int64_t c = 0; c < cols; ++c) {
      const float want =
          fp8_decode(fp8_encode(ref[static_cast<size_t>(c)] * s, Fp8Format::kE4M3), Fp8Format::kE4M3) / s;
      EXPECT_NEAR(row[static_cast<size_t>(r * cols + c)], want, std::fabs(want) * 1e-6f);
      EXPECT_EQ(column[static_cast<size_t>(c * rows + r)], row[static_cast<size_t>(r * cols + c)]);
    }
  }
  EXPECT_GT(testing::snr_db(row_of(x, 0), row_of(tensor, 0)), 28.0);
  const std::vector<float> smallest = row_of(tensor, rows - 1);
  EXPECT_EQ(smallest, std::vector<float>(static_cast<size_t>(cols), 0.0f))
      << "tensorwise: the 1e-6 row is below E4M3's smallest subnormal";
}

// A transposed cast writes the same codes and scales, at the transposed places: q_t[c * rows + r] = q[r * cols + c],
// for every scaling (groups are x's rows or columns either way), both formats, with and without power-of-two scales,
// on shapes of one element, one row, one column and odd sizes.
TEST(Fp8, TransposedCastsAreTheCodesTransposed) {
  constexpr Fp8Scaling kScalings[] = {Fp8Scaling::kTensor, Fp8Scaling::kRow, Fp8Scaling::kColumn};
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 40}, {33, 1}, {7, 33}, {48, 20}})
    for (Fp8Format f : kFormats)
      for (Fp8Scaling s : kScalings)
        for (bool p2 : {false, true}) {
          SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " " << to_string(f) << " scaling "
                                            << static_cast<int>(s) << (p2 ? " pow2" : ""));
          std::vector<float> x = normal(rows * cols, 2.0, static_cast<uint64_t>(rows * 100 + cols));
          for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(c)] *= 1e-3f;  // row 0 on a scale of its own
          const size_t groups = static_cast<size_t>(fp8_groups(s, rows, cols));
          std::vector<uint8_t> q(x.size()), qt(x.size(), 0xab);
          std::vector<float> inv(groups), inv_t(groups);
          fp8_quantize_matrix(x.data(), rows, cols, f, s, p2, Fp8Layout::kRowMajor, q.data(), inv.data(), "x");
          fp8_quantize_matrix(x.data(), rows, cols, f, s, p2, Fp8Layout::kTransposed, qt.data(), inv_t.data(), "x");
          EXPECT_EQ(inv_t, inv);
          int64_t differ = 0;
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c)
              differ += qt[static_cast<size_t>(c * rows + r)] != q[static_cast<size_t>(r * cols + c)] ? 1 : 0;
          EXPECT_EQ(differ, 0);
        }
}

// The three GEMMs of a linear layer on cast operands against fp32: forward (input and weight in E4M3), input gradient
// (output gradient in E5M2, weight in E4M3), weight gradient (output gradient in E5M2, input in E4M3), tensorwise and
// rowwise, at torchao's floors: 25 dB forward, 20 dB for the gradients' GEMMs (these shapes give about 28, 25, 25).
// The maxima are each group's largest magnitude as float bits: by hand on a 2 x 3 matrix, for each grouping; a
// non-finite element is refused naming it.
TEST(Fp8, MaximaAreEachGroupsLargestMagnitudeAsFloatBits) {
  const std::vector<float> x = {1.5f, -4.0f, 0.25f, -0.0f, 3.0f, -7.5f};  // [[1.5, -4, 0.25], [-0, 3, -7.5]]
  auto maxima = [&](Fp8Scaling s) {
    std::vector<unsigned> m(static_cast<size_t>(fp8_groups(s, 2, 3)));
    fp8_maxima(x.data(), 2, 3, s, m.data(), "x");
    std::vector<float> v(m.size());
    std::memcpy(v.data(), m.data(), m.size() * sizeof(float));
    return v;
  };
  EXPECT_EQ(maxima(Fp8Scaling::kTensor), (std::vector<float>{7.5f}));
  EXPECT_EQ(maxima(Fp8Scaling::kRow), (std::vector<float>{4.0f, 7.5f}));
  EXPECT_EQ(maxima(Fp8Scaling::kColumn), (std::vector<float>{1.5f, 4.0f, 7.5f}));
  std::vector<float> bad = x;
  bad[4] = NAN;
  unsigned m = 0;
  try {
    fp8_maxima(bad.data(), 2, 3, Fp8Scaling::kTensor, &m, "dy");
    ADD_FAILURE() << "a NaN was not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("dy: element 4 is nan"), std::string::npos) << e.what();
  }
}

// fp8_fold_maximum, the kernels' amax: from 0, fp8_maxima's tensorwise bits; it keeps a larger value it held; where
// fp8_maxima refuses a non-finite element it folds its bits, an infinity's above every finite value's and a NaN's
// above an infinity's, whatever the sign.
TEST(Fp8, FoldedMaximumIsTheTensorwiseMaximumAndTakesNonFiniteBits) {
  const std::vector<float> x = {1.5f, -4.0f, 0.25f, -0.0f, 3.0f, -7.5f};
  const auto bits = [](float v) {
    unsigned b = 0;
    std::memcpy(&b, &v, sizeof(b));
    return b;
  };
  unsigned want = 0, got = 0;
  fp8_maxima(x.data(), 2, 3, Fp8Scaling::kTensor, &want, "x");
  fp8_fold_maximum(x.data(), 6, &got);
  EXPECT_EQ(got, want);
  EXPECT_EQ(got, bits(7.5f));
  fp8_fold_maximum(x.data(), 0, &got);
  EXPECT_EQ(got, bits(7.5f));
  unsigned above = bits(9.0f);
  fp8_fold_maximum(x.data(), 6, &above);
  EXPECT_EQ(above, bits(9.0f));
  const std::vector<float> zeros = {-0.0f, 0.0f};
  unsigned zero = 0;
  fp8_fold_maximum(zeros.data(), 2, &zero);
  EXPECT_EQ(zero, 0u);

  std::vector<float> bad = x;
  bad[1] = -std::numeric_limits<float>::infinity();
  unsigned inf = 0;
  fp8_fold_maximum(bad.data(), 6, &inf);
  EXPECT_EQ(inf, bits(std::numeric_limits<float>::infinity()));
  bad[4] = -std::numeric_limits<float>::quiet_NaN();
  unsigned nan = 0;
  fp8_fold_maximum(bad.data(), 6, &nan);
  EXPECT_EQ(nan, bits(std::fabs(bad[4])));
  EXPECT_GT(nan, inf);
}

// A cast with its maximum known ahead (train.fp8=delayed's) writes fp8_quantize_with_maxima's codes for a finite
// maximum > 0, whether it is x's own or not (below it, values past it saturate), in both layouts; scales by 1 for a
// maximum of 0; gives a non-finite element the NaN code and leaves the others as they were; turns every code NaN for a
// non-finite maximum; and folds x's own maximum into *own, non-finite elements included.
TEST(Fp8, CastsWithAMaximumKnownAheadAsWithTheirOwnAndRecordTheirOwn) {
  const int64_t rows = 12, cols = 20;
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = normal(rng);
  unsigned own_max = 0;
  fp8_fold_maximum(x.data(), rows * cols, &own_max);
  float m = 0.0f;
  std::memcpy(&m, &own_max, sizeof(m));
  const size_t n = x.size();
  for (const Fp8Format f : kFormats)
    for (const float given : {m, m / 8, 4 * m, 0.0f}) {
      SCOPED_TRACE(::testing::Message() << to_string(f) << " maximum " << given);
      unsigned amax = 0;
      std::memcpy(&amax, &given, sizeof(amax));
      const float scaled_as = given == 0.0f ? fp8_max(f) : given;  // fp8_scale(fp8_max) is 1
      unsigned scaled_by = 0;
      std::memcpy(&scaled_by, &scaled_as, sizeof(scaled_by));
      std::vector<uint8_t> want(n), want_t(n), q(n, 0xab), q_t(n, 0xab);
      float want_inv = 0, inv = 0;
      fp8_quantize_with_maxima(x.data(), rows, cols, f, Fp8Scaling::kTensor, false, Fp8Layout::kRowMajor, &scaled_by,
                               want.data(), &want_inv);
      fp8_quantize_with_maxima(x.data(), rows, cols, f, Fp8Scaling::kTensor, false, Fp8Layout::kTransposed, &scaled_by,
                               want_t.data(), &want_inv);
      unsigned own = 0;
      fp8_quantize_ahead(x.data(), rows, cols, f, &amax, q.data(), q_t.data(), &inv, &own);
      EXPECT_EQ(q, want);
      EXPECT_EQ(q_t, want_t);
      EXPECT_EQ(inv, want_inv);
      EXPECT_EQ(own, own_max);
      if (given == 0.0f) EXPECT_EQ(inv, 1.0f);
    }
  std::vector<float> bad = x;
  bad[7] = -std::numeric_limits<float>::infinity();
  bad[30] = std::numeric_limits<float>::quiet_NaN();
  unsigned amax = 0, own = 0;
  std::memcpy(&amax, &m, sizeof(amax));
  std::vector<uint8_t> q(n), want(n);
  float inv = 0, want_inv = 0;
  fp8_quantize_ahead(bad.data(), rows, cols, Fp8Format::kE4M3, &amax, q.data(), nullptr, &inv, &own);
  fp8_quantize_ahead(x.data(), rows, cols, Fp8Format::kE4M3, &amax, want.data(), nullptr, &want_inv, nullptr);
  EXPECT_EQ(inv, want_inv);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(q[i], i == 7 || i == 30 ? 0x7f : want[i]) << i;
  unsigned bad_max = 0;
  fp8_fold_maximum(bad.data(), rows * cols, &bad_max);
  EXPECT_EQ(own, bad_max);
  const float inf = std::numeric_limits<float>::infinity();
  std::memcpy(&amax, &inf, sizeof(amax));
  fp8_quantize_ahead(x.data(), rows, cols, Fp8Format::kE5M2, &amax, q.data(), nullptr, &inv, nullptr);
  EXPECT_TRUE(std::isnan(inv));
  EXPECT_EQ(q, std::vector<uint8_t>(n, 0x7f));
}

// fp8_quantize_pair_with_maxima with maxima taken beforehand writes fp8_quantize_pair's bytes, for both recipes'
// groupings of a pair grouped alike.
TEST(Fp8, PairWithMaximaTakenBeforehandIsThePair) {
  const int64_t rows = 24, cols = 40;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = normal(rng);
  for (const Fp8Scaling s : {Fp8Scaling::kTensor, Fp8Scaling::kRow, Fp8Scaling::kColumn})
    for (const bool power_of_2 : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "scaling " << static_cast<int>(s) << " power_of_2 " << power_of_2);
      const size_t n = x.size(), g = static_cast<size_t>(fp8_groups(s, rows, cols));
      std::vector<uint8_t> qa(n), qb(n), wa(n), wb(n);
      std::vector<float> ia(g), ib(g), va(g), vb(g);
      fp8_quantize_pair(x.data(), rows, cols, power_of_2, {Fp8Format::kE5M2, s, wa.data(), va.data()},
                        {Fp8Format::kE4M3, s, wb.data(), vb.data()}, "dy");
      std::vector<unsigned> maxima(g);
      fp8_maxima(x.data(), rows, cols, s, maxima.data(), "dy");
      fp8_quantize_pair_with_maxima(x.data(), rows, cols, power_of_2, {Fp8Format::kE5M2, s, qa.data(), ia.data()},
                                    {Fp8Format::kE4M3, s, qb.data(), ib.data()}, maxima.data());
      EXPECT_EQ(qa, wa);
      EXPECT_EQ(qb, wb);
      EXPECT_EQ(ia, va);
      EXPECT_EQ(ib, vb);
    }
}

TEST(Fp8, GemmsOfCastOperandsTrackFp32) {
  const int64_t N = 96, C = 128, OC = 80;
  const std::vector<float> x = normal(N * C, 1.0, 1), w = normal(OC * C, 0.02, 2), dy = normal(N * OC, 1e-3, 3);
  std::vector<float> y(static_cast<size_t>(N * OC)), dx(static_cast<size_t>(N * C)), dw(static_cast<size_t>(OC * C));
  matmul_forward(y.data(), x.data(), w.data(), nullptr, N, static_cast<int>(C), static_cast<int>(OC));
  matmul_backward(dx.data(), dw.data(), nullptr, dy.data(), x.data(), w.data(), N, static_cast<int>(C),
                  static_cast<int>(OC), GradWrite::kOverwrite, GradWrite::kOverwrite);
  for (bool rowwise : {false, true}) {
    SCOPED_TRACE(rowwise ? "rowwise" : "tensorwise");
    const auto cast = [&](const std::vector<float>& v, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling by) {
      std::vector<float> out(v.size());
      fp8_round_trip(v.data(), rows, cols, f, rowwise ? by : Fp8Scaling::kTensor, rowwise, out.data(), "operand");
      return out;
    };
    // Rowwise: each operand scaled along the dimension the GEMM does not sum over.
    const std::vector<float> xq = cast(x, N, C, Fp8Format::kE4M3, Fp8Scaling::kRow),
                             wq = cast(w, OC, C, Fp8Format::kE4M3, Fp8Scaling::kRow);
    std::vector<float> yq(y.size()), dxq(dx.size()), dwq(dw.size());
    matmul_forward(yq.data(), xq.data(), wq.data(), nullptr, N, static_cast<int>(C), static_cast<int>(OC));
    const std::vector<float> dy_rows = cast(dy, N, OC, Fp8Format::kE5M2, Fp8Scaling::kRow),
                             w_cols = cast(w, OC, C, Fp8Format::kE4M3, Fp8Scaling::kColumn);
    matmul_backward(dxq.data(), nullptr, nullptr, dy_rows.data(), x.data(), w_cols.data(), N, static_cast<int>(C),
                    static_cast<int>(OC), GradWrite::kOverwrite, GradWrite::kOverwrite);
    const std::vector<float> dy_cols = cast(dy, N, OC, Fp8Format::kE5M2, Fp8Scaling::kColumn),
                             x_cols = cast(x, N, C, Fp8Format::kE4M3, Fp8Scaling::kColumn);
    matmul_backward(nullptr, dwq.data(), nullptr, dy_cols.data(), x_cols.data(), w.data(), N, static_cast<int>(C),
                    static_cast<int>(OC), GradWrite::kOverwrite, GradWrite::kOverwrite);
    const double fwd = testing::snr_db(y, yq), dgrad = testing::snr_db(dx, dxq), wgrad = testing::snr_db(dw, dwq);
    EXPECT_GT(fwd, 25.0);
    EXPECT_GT(dgrad, 20.0);
    EXPECT_GT(wgrad, 20.0);
  }
}

}  // namespace
}  // namespace st
