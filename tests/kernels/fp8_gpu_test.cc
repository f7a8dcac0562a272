// gpu::fp8_quantize_matrix against its CPU reference (kernels/fp8.h), byte for byte: the codes and the inverse scales
// of tensorwise, per-row and per-column scaling, with and without power-of-two scales, in E4M3 and E5M2, from float and
// from bf16 elements (bf16 as its float value), in x's layout and transposed (odd shapes: partial 32 x 32 tiles), on
// random matrices of odd shapes and on ones with an all-zero row, float subnormals and magnitudes far apart; the first
// non-finite element is refused with the CPU's error. gpu::fp8_quantize_matrix_async writes the same bytes on finite
// input, and NaN codes and scales for the group of a non-finite element, the other groups unchanged;
// gpu::fp8_quantize_pair_async's two casts equal the CPU's pair (also given the maxima beforehand,
// fp8_quantize_pair_with_maxima_async), and the cast in two halves (fp8_maxima_async, then
// fp8_quantize_with_maxima_async) the CPU's halves. dist.fp8_gather's two helpers give the CPU's bytes: a tensor's
// maximum and inverse scale from its parts' maxima (gpu::fp8_scales_of_parts, with an empty part, a zero tensor and a
// NaN maximum), and codes transposed (gpu::fp8_transpose, partial 32 x 32 tiles).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../common/caught.h"
#include "gpu_kernel_test.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/fp8.h"
#include "shardtrain/kernels/gpu/fp8.h"

namespace st {
namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::kE4M3, Fp8Format::kE5M2};
constexpr Fp8Scaling kScalings[] = {Fp8Scaling::kTensor, Fp8Scaling::kRow, Fp8Scaling::kColumn};

struct Casted {
  std::vector<uint8_t> q;
  std::vector<float> inverse;
};

Casted cpu_cast(const std::vector<float>& x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling s, bool p2,
                Fp8Layout layout = Fp8Layout::kRowMajor) {
  Casted c{std::vector<uint8_t>(x.size(), 0xab), std::vector<float>(static_cast<size_t>(fp8_groups(s, rows, cols)))};
  fp8_quantize_matrix(x.data(), rows, cols, f, s, p2, layout, c.q.data(), c.inverse.data(), "x");
  return c;
}

Casted to_host(const DeviceBuffer<uint8_t>& q, const DeviceBuffer<float>& inverse) {
  ST_CUDA_CHECK(cudaDeviceSynchronize());
  Casted c{std::vector<uint8_t>(static_cast<size_t>(q.size())),
           std::vector<float>(static_cast<size_t>(inverse.size()))};
  ST_CUDA_CHECK(cudaMemcpy(c.q.data(), q.data(), q.bytes(), cudaMemcpyDeviceToHost));
  ST_CUDA_CHECK(cudaMemcpy(c.inverse.data(), inverse.data(), inverse.bytes(), cudaMemcpyDeviceToHost));
  return c;
}

enum class Form { kSync, kAsync };

template <typename T>
Casted gpu_cast(const std::vector<float>& x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling s, bool p2,
                Fp8Layout layout = Fp8Layout::kRowMajor, Form form = Form::kSync) {
  const int64_t groups = fp8_groups(s, rows, cols);
  const DeviceBuffer<T> dx = test::to_device<T>(x);
  DeviceBuffer<uint8_t> q(static_cast<int64_t>(x.size()));
  DeviceBuffer<float> inverse(groups);
  test::poison(q);
  test::GpuEnv env(gpu::fp8_quantize_scratch_bytes(groups));
  if (form == Form::kSync)
    gpu::fp8_quantize_matrix<T>(dx.data(), rows, cols, f, s, p2, layout, q.data(), inverse.data(), "x", env.ctx);
  else
    gpu::fp8_quantize_matrix_async<T>(dx.data(), rows, cols, f, s, p2, layout, q.data(), inverse.data(), env.ctx);
  env.stream.synchronize();
  return to_host(q, inverse);
}

::testing::AssertionResult same(const Casted& got, const Casted& want) {
  for (size_t g = 0; g < want.inverse.size(); ++g)
    if (std::memcmp(&got.inverse[g], &want.inverse[g], sizeof(float)) != 0)
      return ::testing::AssertionFailure()
             << "inverse scale " << g << ": " << got.inverse[g] << " != " << want.inverse[g];
  for (size_t i = 0; i < want.q.size(); ++i)
    if (got.q[i] != want.q[i])
      return ::testing::AssertionFailure() << "code " << i << ": " << int{got.q[i]} << " != " << int{want.q[i]};
  return ::testing::AssertionSuccess();
}

// Matrices that reach the casts' corners: an all-zero row (its scale from the 1e-12 floor), float subnormals, rows
// six orders of magnitude apart, a huge element.
std::vector<float> adversarial(int64_t rows, int64_t cols) {
  std::vector<float> x = test::random_input<float>(rows * cols, 9);
  for (int64_t c = 0; c < cols; ++c) {
    x[static_cast<size_t>(c)] = 0.0f;               // row 0
    x[static_cast<size_t>(cols + c)] *= 1e-40f;     // row 1: float subnormals
    x[static_cast<size_t>(2 * cols + c)] *= 1e-6f;  // row 2
  }
  x[static_cast<size_t>(3 * cols + 1)] = 3e38f;
  return x;
}

// Both layouts, the scalar kernels (sizes not multiples of 8) and the packed ones (8 elements a thread): the scalar
// transposed cast runs through 32 x 32 shared-memory tiles (one tile, partial tiles on either side, 513 x 257: 17 x 9
// tiles, the last ones one row or column wide), the packed one through 64 x 64 tiles (136 x 200: partial on both;
// 8 x 16: one partial tile; 264 x 144: 5 x 3 tiles, the last ones partial; 256 x 72: whole row tiles, the last column
// tile 8 wide).
TEST(Fp8Gpu, CastsEqualTheCpusCodesAndScales) {
  ST_SKIP_WITHOUT_GPU();
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {1, 1}, {1, 70}, {70, 1}, {32, 32}, {7, 33}, {64, 48}, {136, 200}, {513, 257}, {8, 16}, {264, 144}, {256, 72}};
  for (const auto& [rows, cols] : shapes)
    for (Fp8Layout l : {Fp8Layout::kRowMajor, Fp8Layout::kTransposed})
      for (Fp8Format f : kFormats)
        for (Fp8Scaling s : kScalings)
          for (bool p2 : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << rows << "x" << cols << " " << to_string(f) << " scaling " << static_cast<int>(s)
                         << (p2 ? " pow2" : "") << (l == Fp8Layout::kTransposed ? " transposed" : ""));
            const std::vector<float> x =
                test::random_input<float>(rows * cols, static_cast<uint64_t>(rows + cols), 3.0f);
            EXPECT_TRUE(same(gpu_cast<float>(x, rows, cols, f, s, p2, l), cpu_cast(x, rows, cols, f, s, p2, l)));
            const std::vector<float> h =
                test::random_input<bf16>(rows * cols, static_cast<uint64_t>(rows * cols), 0.5f);
            EXPECT_TRUE(same(gpu_cast<bf16>(h, rows, cols, f, s, p2, l), cpu_cast(h, rows, cols, f, s, p2, l)));
            if (rows >= 4) {
              const std::vector<float> a = adversarial(rows, cols);
              EXPECT_TRUE(same(gpu_cast<float>(a, rows, cols, f, s, p2, l), cpu_cast(a, rows, cols, f, s, p2, l)));
            }
          }
}

// The pair of casts of one matrix (a linear layer's output gradient: row-major for the input gradient, transposed for
// the weight gradient) equals the CPU's pair, byte for byte: both codes and both inverse scales, for every pairing of
// groups (alike: one pass for the maxima; tensorwise x rowwise and per row x per column: one each) and of formats,
// through the one-read kernel (64 x 64 tiles, partial ones: multiples of 8) and the fallback (odd shapes).
TEST(Fp8Gpu, PairedCastsEqualTheCpusPair) {
  ST_SKIP_WITHOUT_GPU();
  for (const auto& [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{8, 8}, {136, 200}, {7, 33}, {40, 24}, {8, 16}, {264, 144}, {256, 72}})
    for (Fp8Scaling sa : kScalings)
      for (Fp8Scaling sb : kScalings)
        for (Fp8Format fb : kFormats) {
          SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " scalings " << static_cast<int>(sa) << ", "
                                            << static_cast<int>(sb) << " " << to_string(fb));
          const int64_t ga = fp8_groups(sa, rows, cols), gb = fp8_groups(sb, rows, cols);
          const std::vector<float> x = rows >= 4 ? adversarial(rows, cols) : test::random_input<float>(rows * cols, 4);
          const std::vector<float> h = test::random_input<bf16>(rows * cols, 12, 2.0f);
          for (const std::vector<float>* in : {&x, &h}) {
            Casted wa{std::vector<uint8_t>(x.size()), std::vector<float>(static_cast<size_t>(ga))};
            Casted wb{std::vector<uint8_t>(x.size()), std::vector<float>(static_cast<size_t>(gb))};
            fp8_quantize_pair(in->data(), rows, cols, true, {Fp8Format::kE5M2, sa, wa.q.data(), wa.inverse.data()},
                              {fb, sb, wb.q.data(), wb.inverse.data()}, "dy");
            DeviceBuffer<uint8_t> qa(rows * cols), qb(rows * cols);
            DeviceBuffer<float> ia(ga), ib(gb);
            test::poison(qa);
            test::poison(qb);
            test::GpuEnv env(gpu::fp8_quantize_scratch_bytes(ga + gb));
            const Fp8Cast a{Fp8Format::kE5M2, sa, qa.data(), ia.data()}, b{fb, sb, qb.data(), ib.data()};
            if (in == &x) {
              const DeviceBuffer<float> dx = test::to_device<float>(*in);
              gpu::fp8_quantize_pair_async<float>(dx.data(), rows, cols, true, a, b, env.ctx);
              env.stream.synchronize();
            } else {
              const DeviceBuffer<bf16> dx = test::to_device<bf16>(*in);
              gpu::fp8_quantize_pair_async<bf16>(dx.data(), rows, cols, true, a, b, env.ctx);
              env.stream.synchronize();
            }
            EXPECT_TRUE(same(to_host(qa, ia), wa)) << "row-major";
            EXPECT_TRUE(same(to_host(qb, ib), wb)) << "transposed";
            if (sa != sb) continue;
            // The pair with its maxima taken beforehand (fp8_maxima_async here; a producer kernel's amax in a step),
            // into freshly poisoned codes and scales.
            DeviceBuffer<unsigned> maxima(ga);
            for (DeviceBuffer<uint8_t>* q : {&qa, &qb}) test::poison(*q);
            for (DeviceBuffer<float>* inverse : {&ia, &ib}) test::poison(*inverse);
            if (in == &x) {
              const DeviceBuffer<float> dx = test::to_device<float>(*in);
              gpu::fp8_maxima_async<float>(dx.data(), rows, cols, sa, maxima.data(), env.ctx);
              gpu::fp8_quantize_pair_with_maxima_async<float>(dx.data(), rows, cols, true, a, b, maxima.data(),
                                                              env.ctx);
              env.stream.synchronize();
            } else {
              const DeviceBuffer<bf16> dx = test::to_device<bf16>(*in);
              gpu::fp8_maxima_async<bf16>(dx.data(), rows, cols, sa, maxima.data(), env.ctx);
              gpu::fp8_quantize_pair_with_maxima_async<bf16>(dx.data(), rows, cols, true, a, b, maxima.data(), env.ctx);
              env.stream.synchronize();
            }
            EXPECT_TRUE(same(to_host(qa, ia), wa)) << "row-major, maxima taken beforehand";
            EXPECT_TRUE(same(to_host(qb, ib), wb)) << "transposed, maxima taken beforehand";
          }
        }
}

// The cast in two halves (the maxima, then the codes with them), what a layer's backward does with the maxima its
// forward took: each half equals the CPU's, and the codes equal the GPU's one-step cast's, in both layouts (the maxima
// taken once serve both).
TEST(Fp8Gpu, MaximaTakenOnceCastBothLayoutsAsTheCpuDoes) {
  ST_SKIP_WITHOUT_GPU();
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 33}, {136, 200}, {264, 144}})
    for (Fp8Scaling s : kScalings) {
      SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " scaling " << static_cast<int>(s));
      const std::vector<float> x = rows >= 4 ? adversarial(rows, cols) : test::random_input<float>(rows * cols, 2);
      const int64_t groups = fp8_groups(s, rows, cols);
      std::vector<unsigned> want_maxima(static_cast<size_t>(groups));
      fp8_maxima(x.data(), rows, cols, s, want_maxima.data(), "x");
      const DeviceBuffer<float> dx = test::to_device<float>(x);
      DeviceBuffer<unsigned> maxima(groups);
      test::GpuEnv env(gpu::fp8_quantize_scratch_bytes(groups));
      gpu::fp8_maxima_async<float>(dx.data(), rows, cols, s, maxima.data(), env.ctx);
      env.stream.synchronize();
      std::vector<unsigned> got_maxima(static_cast<size_t>(groups));
      ST_CUDA_CHECK(cudaMemcpy(got_maxima.data(), maxima.data(), maxima.bytes(), cudaMemcpyDeviceToHost));
      EXPECT_EQ(got_maxima, want_maxima);
      for (Fp8Layout l : {Fp8Layout::kRowMajor, Fp8Layout::kTransposed})
        for (Fp8Format f : kFormats) {
          DeviceBuffer<uint8_t> q(rows * cols);
          DeviceBuffer<float> inverse(groups);
          test::poison(q);
          gpu::fp8_quantize_with_maxima_async<float>(dx.data(), rows, cols, f, s, true, l, maxima.data(), q.data(),
                                                     inverse.data(), env.ctx);
          env.stream.synchronize();
          Casted cpu{std::vector<uint8_t>(x.size()), std::vector<float>(static_cast<size_t>(groups))};
          fp8_quantize_with_maxima(x.data(), rows, cols, f, s, true, l, want_maxima.data(), cpu.q.data(),
                                   cpu.inverse.data());
          const Casted halves = to_host(q, inverse);
          EXPECT_TRUE(same(halves, cpu)) << to_string(f) << (l == Fp8Layout::kTransposed ? " t" : "");
          EXPECT_TRUE(same(halves, gpu_cast<float>(x, rows, cols, f, s, true, l))) << "against the one-step cast";
        }
    }
}

TEST(Fp8Gpu, AsyncCastsEqualTheWaitingOnesOnFiniteInput) {
  ST_SKIP_WITHOUT_GPU();
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 33}, {130, 96}, {136, 144}})
    for (Fp8Layout layout : {Fp8Layout::kRowMajor, Fp8Layout::kTransposed})
      for (Fp8Scaling s : kScalings) {
        SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " scaling " << static_cast<int>(s)
                                          << (layout == Fp8Layout::kTransposed ? " transposed" : ""));
        const std::vector<float> a = rows >= 4 ? adversarial(rows, cols) : test::random_input<float>(rows * cols, 5);
        EXPECT_TRUE(same(gpu_cast<float>(a, rows, cols, Fp8Format::kE4M3, s, true, layout, Form::kAsync),
                         gpu_cast<float>(a, rows, cols, Fp8Format::kE4M3, s, true, layout, Form::kSync)));
        const std::vector<float> h = test::random_input<bf16>(rows * cols, 6);
        EXPECT_TRUE(same(gpu_cast<bf16>(h, rows, cols, Fp8Format::kE5M2, s, false, layout, Form::kAsync),
                         gpu_cast<bf16>(h, rows, cols, Fp8Format::kE5M2, s, false, layout, Form::kSync)));
      }
}

// The async cast lets a non-finite element through as NaNs: its group's inverse scale and every code of the group
// decode to NaN (so a GEMM's outputs that read them are NaN), and the other groups are the CPU's cast of the matrix
// with that element zeroed (the element leaves no trace in their scales).
TEST(Fp8Gpu, AsyncCastsTurnTheGroupOfANonFiniteElementIntoNaNs) {
  ST_SKIP_WITHOUT_GPU();
  const int64_t rows = 40, bad_r = 5, bad_c = 17;
  for (const int64_t cols : {24, 32})  // the transposed cast through a partial 64 x 64 tile, two widths
    for (float bad : {NAN, INFINITY, -INFINITY})
      for (Fp8Scaling s : kScalings)
        for (Fp8Layout layout : {Fp8Layout::kRowMajor, Fp8Layout::kTransposed}) {
          SCOPED_TRACE(::testing::Message() << cols << " columns, " << bad << " scaling " << static_cast<int>(s)
                                            << (layout == Fp8Layout::kTransposed ? " transposed" : ""));
          std::vector<float> x = test::random_input<float>(rows * cols, 8);
          x[static_cast<size_t>(bad_r * cols + bad_c)] = 0.0f;
          const Casted clean = cpu_cast(x, rows, cols, Fp8Format::kE4M3, s, false, layout);
          x[static_cast<size_t>(bad_r * cols + bad_c)] = bad;
          const Casted got = gpu_cast<float>(x, rows, cols, Fp8Format::kE4M3, s, false, layout, Form::kAsync);
          const int64_t bad_group = fp8_group(s, bad_r, bad_c);
          int64_t wrong = 0;
          for (int64_t g = 0; g < static_cast<int64_t>(got.inverse.size()); ++g) {
            const float inv = got.inverse[static_cast<size_t>(g)];
            wrong +=
                g == bad_group ? !std::isnan(inv) : std::memcmp(&inv, &clean.inverse[static_cast<size_t>(g)], 4) != 0;
          }
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < cols; ++c) {
              const size_t at = static_cast<size_t>(layout == Fp8Layout::kTransposed ? c * rows + r : r * cols + c);
              wrong += fp8_group(s, r, c) == bad_group ? !std::isnan(fp8_decode(got.q[at], Fp8Format::kE4M3))
                                                       : got.q[at] != clean.q[at];
            }
          EXPECT_EQ(wrong, 0);
        }
}

// gpu::fp8_quantize_ahead_async against the CPU's fp8_quantize_ahead, byte for byte: codes in either layout or both
// (the one-read 64 x 64 tiles, partial ones, and the scalar kernels of odd shapes), the inverse scale and the folded
// own maximum, from float and bf16, for a maximum x's own, below it (saturating), above it and 0, and with non-finite
// elements (their codes NaN's, the others unchanged, own non-finite).
TEST(Fp8Gpu, CastsWithAMaximumKnownAheadAsTheCpu) {
  ST_SKIP_WITHOUT_GPU();
  const auto bits = [](float v) {
    unsigned b = 0;
    std::memcpy(&b, &v, sizeof(b));
    return b;
  };
  const auto run = [&](const std::vector<float>& x, int64_t rows, int64_t cols, Fp8Format f, unsigned amax, bool want_q,
                       bool want_t, bool as_bf16) {
    const size_t n = x.size();
    std::vector<uint8_t> q(n, 0xab), q_t(n, 0xab), gq(n), gq_t(n);
    float inv = 0, ginv = 0;
    unsigned own = 0, gown = 0;
    fp8_quantize_ahead(x.data(), rows, cols, f, &amax, want_q ? q.data() : nullptr, want_t ? q_t.data() : nullptr, &inv,
                       &own);
    DeviceBuffer<uint8_t> dq(static_cast<int64_t>(n)), dq_t(static_cast<int64_t>(n));
    test::poison(dq);
    test::poison(dq_t);
    DeviceBuffer<float> dinv(1);
    DeviceBuffer<unsigned> damax(1), down(1);
    ST_CUDA_CHECK(cudaMemcpy(damax.data(), &amax, sizeof(amax), cudaMemcpyHostToDevice));
    ST_CUDA_CHECK(cudaMemset(down.data(), 0, sizeof(unsigned)));
    test::GpuEnv env(gpu::fp8_quantize_scratch_bytes(1));
    uint8_t* const a = want_q ? dq.data() : nullptr;
    uint8_t* const t = want_t ? dq_t.data() : nullptr;
    if (as_bf16) {
      const DeviceBuffer<bf16> dx = test::to_device<bf16>(x);
      gpu::fp8_quantize_ahead_async<bf16>(dx.data(), rows, cols, f, damax.data(), a, t, dinv.data(), down.data(),
                                          env.ctx);
      env.stream.synchronize();
    } else {
      const DeviceBuffer<float> dx = test::to_device<float>(x);
      gpu::fp8_quantize_ahead_async<float>(dx.data(), rows, cols, f, damax.data(), a, t, dinv.data(), down.data(),
                                           env.ctx);
      env.stream.synchronize();
    }
    ST_CUDA_CHECK(cudaMemcpy(gq.data(), dq.data(), n, cudaMemcpyDeviceToHost));
    ST_CUDA_CHECK(cudaMemcpy(gq_t.data(), dq_t.data(), n, cudaMemcpyDeviceToHost));
    ST_CUDA_CHECK(cudaMemcpy(&ginv, dinv.data(), sizeof(float), cudaMemcpyDeviceToHost));
    ST_CUDA_CHECK(cudaMemcpy(&gown, down.data(), sizeof(unsigned), cudaMemcpyDeviceToHost));
    if (want_q) EXPECT_EQ(gq, q);
    if (want_t) EXPECT_EQ(gq_t, q_t);
    EXPECT_EQ(bits(ginv), bits(inv));
    // A NaN's payload is the hardware's: the GPU's |NaN| is 0x7fffffff. Both above every finite value's bits.
    if (own > bits(INFINITY))
      EXPECT_GT(gown, bits(INFINITY));
    else
      EXPECT_EQ(gown, own);
  };
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1}, {7, 33}, {8, 16}, {136, 200}, {264, 144}, {40, 24}};
  for (const auto& [rows, cols] : shapes)
    for (const Fp8Format f : kFormats)
      for (const bool as_bf16 : {false, true}) {
        std::vector<float> x =
            as_bf16 ? test::random_input<bf16>(rows * cols, 4, 0.5f) : test::random_input<float>(rows * cols, 3, 3.0f);
        unsigned own = 0;
        fp8_fold_maximum(x.data(), rows * cols, &own);
        float m = 0.0f;
        std::memcpy(&m, &own, sizeof(m));
        for (const float given : {m, m / 8, 2 * m, 0.0f})
          for (const auto& [want_q, want_t] : {std::pair{true, true}, {true, false}, {false, true}}) {
            SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " " << to_string(f) << (as_bf16 ? " bf16" : "")
                                              << " maximum " << given << " q " << want_q << " q_t " << want_t);
            run(x, rows, cols, f, bits(given), want_q, want_t, as_bf16);
          }
        if (rows * cols < 8) continue;
        x[5] = -INFINITY;
        x[static_cast<size_t>(rows * cols - 2)] = NAN;
        SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " " << to_string(f) << " non-finite elements");
        run(x, rows, cols, f, bits(m), true, true, as_bf16);
      }
}

TEST(Fp8Gpu, TheFirstNonFiniteElementIsRefusedAsTheCpuRefusesIt) {
  ST_SKIP_WITHOUT_GPU();
  std::vector<float> x = test::random_input<float>(40 * 16, 3);
  x[300] = NAN;
  x[77] = -INFINITY;
  std::vector<uint8_t> q(x.size());
  std::vector<float> inv(1);
  const Error want = testing::caught([&] {
    fp8_quantize_matrix(x.data(), 40, 16, Fp8Format::kE4M3, Fp8Scaling::kTensor, false, Fp8Layout::kRowMajor, q.data(),
                        inv.data(), "x");
  });
  const DeviceBuffer<float> dx = test::to_device<float>(x);
  DeviceBuffer<uint8_t> dq(static_cast<int64_t>(x.size()));
  DeviceBuffer<float> dinv(1);
  test::GpuEnv env(gpu::fp8_quantize_scratch_bytes(1));
  const Error got = testing::caught([&] {
    gpu::fp8_quantize_matrix<float>(dx.data(), 40, 16, Fp8Format::kE4M3, Fp8Scaling::kTensor, false,
                                    Fp8Layout::kTransposed, dq.data(), dinv.data(), "x", env.ctx);
  });
  EXPECT_EQ(got.kind(), ErrorKind::kBadInput);
  EXPECT_EQ(std::string(got.what()), std::string(want.what()));
  EXPECT_NE(std::string(got.what()).find("x: element 77 is -inf"), std::string::npos) << got.what();
}

TEST(Fp8Gpu, ScalesOfPartsAndTransposedCodesEqualTheCpus) {
  ST_SKIP_WITHOUT_GPU();
  test::GpuEnv env(0);
  // [world 3][k 4]: tensor 0's largest on rank 1, tensor 1 on rank 0 only, tensor 2 all zero, tensor 3 a NaN maximum
  // (which only the device takes: the CPU refuses non-finite elements before any maximum).
  const float parts[12] = {0.5f, 2.0f, 0.0f, 1.0f, 7.25f, 0.0f, 0.0f, NAN, 1e-30f, 0.0f, 0.0f, 3.0f};
  std::vector<unsigned> bits(12), finite(12);
  std::memcpy(bits.data(), parts, sizeof(parts));
  finite = bits;
  finite[7] = 0;
  for (Fp8Format f : kFormats)
    for (bool p2 : {false, true}) {
      std::vector<unsigned> want_max(4);
      std::vector<float> want_inv(4);
      fp8_scales_of_parts(finite.data(), 3, 4, f, p2, want_max.data(), want_inv.data());
      const DeviceBuffer<unsigned> d = test::ints_to_device(bits);
      DeviceBuffer<unsigned> got_max(4);
      DeviceBuffer<float> got_inv(4);
      gpu::fp8_scales_of_parts(d.data(), 3, 4, f, p2, got_max.data(), got_inv.data(), env.ctx);
      const std::vector<unsigned> m = test::ints_to_host(got_max);
      const std::vector<float> inv = test::ints_to_host(got_inv);
      for (size_t t = 0; t < 3; ++t) {
        EXPECT_EQ(m[t], want_max[t]) << "tensor " << t;
        EXPECT_EQ(std::memcmp(&inv[t], &want_inv[t], sizeof(float)), 0)
            << "tensor " << t << ": " << inv[t] << " != " << want_inv[t];
      }
      EXPECT_TRUE(std::isnan(inv[3]));
    }
  for (const auto& [rows, cols] :
       {std::pair<int64_t, int64_t>{32, 32}, {513, 257}, {48, 1024}, {264, 72}, {520, 136}}) {
    std::vector<uint8_t> q(static_cast<size_t>(rows * cols)), want(q.size());
    for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<uint8_t>((i * 2654435761u) >> 24);
    fp8_transpose(q.data(), rows, cols, want.data());
    const DeviceBuffer<uint8_t> dq = test::ints_to_device(q);
    DeviceBuffer<uint8_t> out(rows * cols);
    gpu::fp8_transpose(dq.data(), rows, cols, out.data(), env.ctx);
    EXPECT_EQ(test::ints_to_host(out), want) << rows << " x " << cols;
  }
}

}  // namespace
}  // namespace st
