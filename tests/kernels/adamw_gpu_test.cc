// gpu::adamw_update against the CPU reference st::adamw_update.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/adamw.h"
#include "shardtrain/kernels/gpu/adamw.h"

namespace st {
namespace {

using test::close;
using test::kTol;
using test::to_device;
using test::to_host;

// The fp32 state follows the reference's arithmetic step for step (no FMA); 1e-6 leaves room for nothing
// but a compiler that still contracts.
constexpr double kStateTol = 1e-6;

// n elements starting `offset` into each buffer: offset 1 misaligns every pointer (scalar path); n % 4 != 0
// leaves a tail after the packs.
struct Shape {
  int64_t n;
  int offset;
};
const Shape kShapes[] = {{1, 0}, {7, 0}, {1000, 0}, {4099, 0}, {4099, 1}, {100003, 0}};

AdamWParams params() {
  AdamWParams p;
  p.lr = 1e-3f;
  p.weight_decay = 0.1f;
  p.step = 7;
  p.grad_scale = 0.8f;
  return p;
}

template <typename T>
class AdamWGpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(AdamWGpuTest, test::ActivationTypes, test::ActivationNames);

TYPED_TEST(AdamWGpuTest, MatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const AdamWParams hp = params();
  for (const Shape& s : kShapes) {
    for (bool with_out : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "n=" << s.n << " offset=" << s.offset << " param_out=" << with_out);
      std::vector<float> param = test::random_input<float>(s.n, 1);
      std::vector<float> m = test::random_input<float>(s.n, 2, 0.1f);
      std::vector<float> v = test::random_input<float>(s.n, 3, 0.1f);
      for (float& x : v) x *= x;  // v >= 0
      const std::vector<float> grad = test::random_input<float>(s.n, 4);
      test::GpuEnv env;
      DeviceBuffer<float> d_param = test::upload<float>(param, s.offset), d_m = test::upload<float>(m, s.offset);
      DeviceBuffer<float> d_v = test::upload<float>(v, s.offset), d_grad = test::upload<float>(grad, s.offset);
      DeviceBuffer<T> d_out(s.offset + s.n);
      test::poison(d_out);
      adamw_update(param.data(), m.data(), v.data(), grad.data(), s.n, hp);

      gpu::adamw_update<T>(d_param.data() + s.offset, d_m.data() + s.offset, d_v.data() + s.offset,
                           d_grad.data() + s.offset, s.n, hp, with_out ? d_out.data() + s.offset : nullptr, env.ctx);
      EXPECT_TRUE(close(test::download(d_param, s.offset), param, kStateTol)) << "param";
      EXPECT_TRUE(close(test::download(d_m, s.offset), m, kStateTol)) << "m";
      EXPECT_TRUE(close(test::download(d_v, s.offset), v, kStateTol)) << "v";
      if (with_out) {
        EXPECT_TRUE(close(test::download(d_out, s.offset), test::round_through<T>(param), kTol<T>)) << "param_out";
      } else {  // left alone: still the poison
        for (float x : test::download(d_out, s.offset)) ASSERT_TRUE(std::isnan(x));
      }
    }
  }
}

// A unit's runs as adamw_runs gives them (contiguous, the decay alternating), more than one launch holds (16), a
// run of no elements, runs that start mid-pack, a gap, and a run with another learning rate (a launch of its own).
std::vector<AdamWRun> unit_like_runs() {
  std::vector<AdamWRun> runs;
  AdamWParams p = params();
  int64_t at = 0;
  const int64_t counts[] = {3, 1024, 0, 5, 4099, 1, 64, 7, 2, 1000, 13, 4, 4, 9, 11, 6, 8, 17, 1024, 3};
  for (size_t k = 0; k < std::size(counts); ++k) {
    p.weight_decay = k % 2 == 0 ? 0.0f : 0.1f;
    runs.push_back(AdamWRun{at, counts[k], p});
    at += counts[k];
  }
  at += 5;  // elements no run covers: left alone
  runs.push_back(AdamWRun{at, 333, p});
  at += 333;
  p.lr = 2e-3f;
  runs.push_back(AdamWRun{at, 100, p});
  return runs;
}

// adamw_update_runs: the CPU reference's numbers, and the same bits as one gpu::adamw_update a run (whose rounded
// output MatchesCpu checks).
TYPED_TEST(AdamWGpuTest, RunsMatchCpuAndSingleRunsBitForBit) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const std::vector<AdamWRun> runs = unit_like_runs();
  const int64_t n = runs.back().offset + runs.back().count;
  std::vector<float> param = test::random_input<float>(n, 1);
  std::vector<float> m = test::random_input<float>(n, 2, 0.1f);
  std::vector<float> v = test::random_input<float>(n, 3, 0.1f);
  for (float& x : v) x *= x;
  const std::vector<float> grad = test::random_input<float>(n, 4);
  test::GpuEnv env;
  DeviceBuffer<float> a_param = to_device<float>(param), a_m = to_device<float>(m), a_v = to_device<float>(v);
  DeviceBuffer<float> b_param = to_device<float>(param), b_m = to_device<float>(m), b_v = to_device<float>(v);
  DeviceBuffer<float> d_grad = to_device<float>(grad);
  DeviceBuffer<T> a_out(n), b_out(n);
  test::poison(a_out);
  test::poison(b_out);
  gpu::adamw_update_runs<T>(a_param.data(), a_m.data(), a_v.data(), d_grad.data(), runs, a_out.data(), env.ctx);
  for (const AdamWRun& r : runs)
    gpu::adamw_update<T>(b_param.data() + r.offset, b_m.data() + r.offset, b_v.data() + r.offset,
                         d_grad.data() + r.offset, r.count, r.params, b_out.data() + r.offset, env.ctx);
  const std::vector<float> before = param;
  adamw_update_runs(param.data(), m.data(), v.data(), grad.data(), runs);
  const std::vector<float> got = to_host(a_param);
  EXPECT_TRUE(close(got, param, kStateTol)) << "param";
  EXPECT_TRUE(close(to_host(a_m), m, kStateTol)) << "m";
  EXPECT_TRUE(close(to_host(a_v), v, kStateTol)) << "v";
  EXPECT_EQ(got, to_host(b_param));
  EXPECT_EQ(to_host(a_m), to_host(b_m));
  EXPECT_EQ(to_host(a_v), to_host(b_v));
  const std::vector<float> out = to_host(a_out), single_out = to_host(b_out);
  for (int64_t i = 0; i < n; ++i) {
    const bool covered = std::any_of(runs.begin(), runs.end(),
                                     [&](const AdamWRun& r) { return i >= r.offset && i < r.offset + r.count; });
    if (covered) {
      ASSERT_EQ(out[i], single_out[i]) << i;
    } else {  // the gap: untouched
      ASSERT_EQ(got[i], before[i]) << i;
      ASSERT_TRUE(std::isnan(out[i])) << i;
    }
  }
}

}  // namespace
}  // namespace st
