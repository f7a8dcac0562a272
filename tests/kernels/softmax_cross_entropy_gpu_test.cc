// gpu::softmax_cross_entropy against the CPU reference st::softmax_cross_entropy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/gpu/softmax_cross_entropy.h"
#include "shardtrain/kernels/softmax_cross_entropy.h"

namespace st {
namespace {

using test::close;
using test::kTol;
using test::to_device;
using test::to_host;

struct Shape {
  int64_t N;
  int V, Vp;
};
// Vp % 8 == 0: packed path (with V not a multiple of 8, a partial pack at V); Vp = 7, 5003: scalar path.
// 50304 is GPT-2's padded vocabulary; 70008 is wider than 64 Ki. On an H100/H200 packed rows of up to 113 KB
// take the one-read kernel (the row staged in shared memory): up to 50304 for bf16 and fp16, up to 16416 for float
// (several packs a thread); 70008, and 50304 for float, take the fallback.
const Shape kShapes[] = {{1, 7, 7},         {3, 50, 64},       {5, 1001, 1024},  {2, 5000, 5003},
                         {3, 16411, 16416}, {4, 50257, 50304}, {2, 70001, 70008}};
constexpr float kDloss = 0.37f;

// Logits of scale 3 (a peaked softmax), targets in [0, V), and the CPU losses and gradient. With `masked`, every
// third row from row 0 is not a target (-1, or -100 as PyTorch's ignore_index, alternately).
template <typename T>
struct Problem {
  explicit Problem(const Shape& s, float dloss = kDloss, bool masked = false)
      : logits(test::random_input<T>(s.N * s.Vp, 1, 3.0f)),
        targets(test::random_ints(s.N, s.V, 2)),
        losses(s.N),
        dlogits(s.N * s.Vp) {
    if (masked)
      for (int64_t n = 0; n < s.N; n += 3) targets[static_cast<size_t>(n)] = n % 2 == 0 ? -1 : -100;
    softmax_cross_entropy(losses.data(), dlogits.data(), logits.data(), targets.data(), s.N, s.V, s.Vp, dloss);
  }
  std::vector<float> logits;
  std::vector<int32_t> targets;
  std::vector<float> losses, dlogits;
};

// A problem's operands on the device, dlogits and losses poisoned; run() computes into losses and `out` (dlogits,
// the logits themselves for in place, or null).
template <typename T>
struct OnDevice {
  const Shape s;
  test::GpuEnv env;
  DeviceBuffer<T> logits, dlogits;
  DeviceBuffer<int32_t> targets;
  DeviceBuffer<float> losses;
  OnDevice(const Shape& shape, const Problem<T>& p)
      : s(shape),
        logits(to_device<T>(p.logits)),
        dlogits(s.N * s.Vp),
        targets(test::ints_to_device(p.targets)),
        losses(s.N) {
    test::poison(dlogits);
    test::poison(losses);
  }
  void run(T* out, float dloss = kDloss) {
    gpu::softmax_cross_entropy<T>(losses.data(), out, logits.data(), targets.data(), s.N, s.V, s.Vp, dloss, env.ctx);
  }
};

template <typename T>
class SoftmaxCrossEntropyGpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(SoftmaxCrossEntropyGpuTest, test::ActivationTypes, test::ActivationNames);

TYPED_TEST(SoftmaxCrossEntropyGpuTest, MatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp);
    const Problem<T> p(s);
    OnDevice<T> d(s, p);
    d.run(d.dlogits.data());
    // The losses are fp32 from the same operands whatever T is.
    EXPECT_TRUE(close(to_host(d.losses), p.losses, kTol<float>)) << "losses";
    EXPECT_TRUE(close(to_host(d.dlogits), p.dlogits, kTol<T>)) << "dlogits";

    // Without dlogits: the same losses, bit for bit (the same kernel and summation order), nothing else written.
    const std::vector<float> with_dlogits = to_host(d.losses);
    test::poison(d.losses);
    d.run(nullptr);
    EXPECT_TRUE(test::bitwise_equal(to_host(d.losses), with_dlogits)) << "losses without dlogits";
  }
}

// Many rows: more than the SMs hold blocks at once, and 65600 rows, more than the grid's 65536 blocks, so some
// blocks stage a second row into the shared memory of their first. Still the CPU's losses and gradient, and in
// place the same bits as out of place.
TYPED_TEST(SoftmaxCrossEntropyGpuTest, ManyRows) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : {Shape{300, 1001, 1024}, Shape{300, 50257, 50304}, Shape{65600, 50, 64}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp);
    const Problem<T> p(s);
    OnDevice<T> d(s, p);
    d.run(d.dlogits.data());
    const std::vector<float> out_of_place = to_host(d.dlogits), out_losses = to_host(d.losses);
    EXPECT_TRUE(close(out_losses, p.losses, kTol<float>)) << "losses";
    EXPECT_TRUE(close(out_of_place, p.dlogits, kTol<T>)) << "dlogits";
    test::poison(d.losses);
    d.run(d.logits.data());
    EXPECT_TRUE(test::bitwise_equal(to_host(d.logits), out_of_place)) << "in place";
    EXPECT_TRUE(test::bitwise_equal(to_host(d.losses), out_losses)) << "losses in place";
  }
}

// Half-precision rows fold dloss / sum into the exponent only when it is positive: a zero or negative dloss takes
// the plain formula, and still matches the CPU (a zero one gives exact zeros).
TYPED_TEST(SoftmaxCrossEntropyGpuTest, NonPositiveDlossMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : {Shape{3, 50, 64}, Shape{4, 50257, 50304}, Shape{2, 5000, 5003}}) {
    for (float dloss : {0.0f, -0.37f}) {
      SCOPED_TRACE(::testing::Message() << "V=" << s.V << " Vp=" << s.Vp << " dloss=" << dloss);
      const Problem<T> p(s, dloss);
      OnDevice<T> d(s, p);
      d.run(d.dlogits.data(), dloss);
      const std::vector<float> got = to_host(d.dlogits);
      if (dloss == 0.0f) {
        EXPECT_EQ(std::count(got.begin(), got.end(), 0.0f), static_cast<std::ptrdiff_t>(got.size()));
      } else {
        EXPECT_TRUE(close(got, p.dlogits, kTol<T>));
      }
      EXPECT_TRUE(close(to_host(d.losses), p.losses, kTol<float>));
    }
  }
}

TYPED_TEST(SoftmaxCrossEntropyGpuTest, InPlace) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp);
    const Problem<T> p(s);
    test::GpuEnv env;
    DeviceBuffer<T> logits = to_device<T>(p.logits);
    DeviceBuffer<int32_t> targets = test::ints_to_device(p.targets);
    DeviceBuffer<float> losses(s.N);
    test::poison(losses);
    gpu::softmax_cross_entropy<T>(losses.data(), logits.data(), logits.data(), targets.data(), s.N, s.V, s.Vp, kDloss,
                                  env.ctx);
    EXPECT_TRUE(close(to_host(losses), p.losses, kTol<float>)) << "losses";
    EXPECT_TRUE(close(to_host(logits), p.dlogits, kTol<T>)) << "dlogits";
  }
}

// Rows whose target is < 0 (masked) get loss 0 and a dlogits row of exact zeros, padding included, on every path, out
// of place and in place; every other row is the CPU's, element by element. Shapes with one row (all of it masked)
// and with more rows than the grid has blocks.
TYPED_TEST(SoftmaxCrossEntropyGpuTest, IgnoredRowsMatchCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  std::vector<Shape> shapes(std::begin(kShapes), std::end(kShapes));
  shapes.push_back({300, 50257, 50304});
  shapes.push_back({65600, 50, 64});
  for (const Shape& s : shapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " V=" << s.V << " Vp=" << s.Vp);
    const Problem<T> p(s, kDloss, /*masked=*/true);
    OnDevice<T> d(s, p);
    d.run(d.dlogits.data());
    const std::vector<float> losses = to_host(d.losses), dlogits = to_host(d.dlogits);
    EXPECT_TRUE(close(losses, p.losses, kTol<float>)) << "losses";
    EXPECT_TRUE(close(dlogits, p.dlogits, kTol<T>)) << "dlogits";
    int64_t ignored = 0;
    for (int64_t n = 0; n < s.N; ++n) {
      if (p.targets[static_cast<size_t>(n)] >= 0) continue;
      ++ignored;
      ASSERT_EQ(losses[static_cast<size_t>(n)], 0.0f) << "row " << n;
      for (int64_t c = 0; c < s.Vp; ++c)
        ASSERT_EQ(dlogits[static_cast<size_t>(n * s.Vp + c)], 0.0f) << "row " << n << " col " << c;
    }
    EXPECT_EQ(ignored, (s.N + 2) / 3);
    // Without dlogits: the same losses, bit for bit.
    test::poison(d.losses);
    d.run(nullptr);
    EXPECT_TRUE(test::bitwise_equal(to_host(d.losses), losses)) << "losses without dlogits";
    // In place: the same bits as out of place.
    test::poison(d.losses);
    d.run(d.logits.data());
    EXPECT_TRUE(test::bitwise_equal(to_host(d.logits), dlogits)) << "in place";
    EXPECT_TRUE(test::bitwise_equal(to_host(d.losses), losses)) << "losses in place";
  }
}

// A target >= V gives a NaN loss, on every path; a target < 0 is a masked row (IgnoredRowsMatchCpu).
TYPED_TEST(SoftmaxCrossEntropyGpuTest, OutOfRangeTargetGivesNan) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "V=" << s.V << " Vp=" << s.Vp);
    test::GpuEnv env;
    DeviceBuffer<T> logits = to_device<T>(test::random_input<T>(2 * s.Vp, 1, 3.0f)), dlogits(2 * s.Vp);
    DeviceBuffer<int32_t> targets = test::ints_to_device(std::vector<int32_t>{s.V + 1, s.V});
    DeviceBuffer<float> losses(2);
    gpu::softmax_cross_entropy<T>(losses.data(), dlogits.data(), logits.data(), targets.data(), 2, s.V, s.Vp, kDloss,
                                  env.ctx);
    for (float loss : to_host(losses)) EXPECT_TRUE(std::isnan(loss));
    // The padding columns [V, Vp) stay zero, also where the out-of-range target (V) falls among them.
    const std::vector<float> d = to_host(dlogits);
    for (int64_t r = 0; r < 2; ++r)
      for (int c = s.V; c < s.Vp; ++c)
        EXPECT_EQ(d[static_cast<size_t>(r * s.Vp + c)], 0.0f) << "row " << r << " col " << c;
  }
}

}  // namespace
}  // namespace st
