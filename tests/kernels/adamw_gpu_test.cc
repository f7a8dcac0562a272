// gpu::adamw_update against the CPU reference st::adamw_update.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
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

// param, m, v (>= 0) and grad of n elements, from seeds seed .. seed + 3.
struct State {
  std::vector<float> param, m, v, grad;
};
State random_state(int64_t n, uint64_t seed) {
  State st{test::random_input<float>(n, seed), test::random_input<float>(n, seed + 1, 0.1f),
           test::random_input<float>(n, seed + 2, 0.1f), test::random_input<float>(n, seed + 3)};
  for (float& x : st.v) x *= x;
  return st;
}

// Two device copies (a, b) of param, m and v, the gradient, and two outputs in T poisoned with NaN.
template <typename T>
struct TwoCopies {
  TwoCopies(const std::vector<float>& param, const std::vector<float>& m, const std::vector<float>& v,
            const std::vector<float>& grad)
      : a_param(to_device<float>(param)),
        a_m(to_device<float>(m)),
        a_v(to_device<float>(v)),
        b_param(to_device<float>(param)),
        b_m(to_device<float>(m)),
        b_v(to_device<float>(v)),
        grad(to_device<float>(grad)),
        a_out(static_cast<int64_t>(param.size())),
        b_out(static_cast<int64_t>(param.size())) {
    test::poison(a_out);
    test::poison(b_out);
  }
  DeviceBuffer<float> a_param, a_m, a_v, b_param, b_m, b_v, grad;
  DeviceBuffer<T> a_out, b_out;
};

// adamw_update_runs: the CPU reference's numbers, and the same bits as one gpu::adamw_update a run (whose rounded
// output MatchesCpu checks).
TYPED_TEST(AdamWGpuTest, RunsMatchCpuAndSingleRunsBitForBit) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const std::vector<AdamWRun> runs = unit_like_runs();
  const int64_t n = runs.back().offset + runs.back().count;
  auto [param, m, v, grad] = random_state(n, 1);
  test::GpuEnv env;
  TwoCopies<T> d(param, m, v, grad);
  auto& [a_param, a_m, a_v, b_param, b_m, b_v, d_grad, a_out, b_out] = d;
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

// The step's gate read on the device: the same bits as runs carrying its grad_scale (the CPU reference's numbers with
// that gate), and a skipping gate leaves the state and the rounded copy untouched.
TYPED_TEST(AdamWGpuTest, GateReplacesGradScaleOrSkips) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const std::vector<AdamWRun> runs = unit_like_runs();
  const int64_t n = runs.back().offset + runs.back().count;
  const auto [param, m, v, grad] = random_state(n, 5);
  test::GpuEnv env;
  StepGate gate;
  gate.grad_scale = 0.37f;
  std::vector<AdamWRun> scaled = runs;
  for (AdamWRun& r : scaled) r.params.grad_scale = gate.grad_scale;
  for (int skip : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "skip=" << skip);
    gate.skip = skip;
    DeviceBuffer<StepGate> d_gate(1);
    ST_CUDA_CHECK(cudaMemcpy(d_gate.data(), &gate, sizeof(StepGate), cudaMemcpyHostToDevice));
    ST_CUDA_CHECK(cudaDeviceSynchronize());  // see to_device in tests/common/gpu_test.h
    TwoCopies<T> d(param, m, v, grad);
    auto& [a_param, a_m, a_v, b_param, b_m, b_v, d_grad, a_out, b_out] = d;
    gpu::adamw_update_runs<T>(a_param.data(), a_m.data(), a_v.data(), d_grad.data(), runs, a_out.data(), env.ctx,
                              d_gate.data());
    std::vector<float> want_param = param, want_m = m, want_v = v;
    adamw_update_runs(want_param.data(), want_m.data(), want_v.data(), grad.data(), runs, &gate);
    const std::vector<float> got = to_host(a_param);
    if (skip) {
      EXPECT_EQ(got, param);
      EXPECT_EQ(to_host(a_m), m);
      EXPECT_EQ(to_host(a_v), v);
      for (float x : to_host(a_out)) ASSERT_TRUE(std::isnan(x));
      continue;
    }
    gpu::adamw_update_runs<T>(b_param.data(), b_m.data(), b_v.data(), d_grad.data(), scaled, b_out.data(), env.ctx);
    EXPECT_TRUE(close(got, want_param, kStateTol)) << "param";
    EXPECT_TRUE(close(to_host(a_m), want_m, kStateTol)) << "m";
    EXPECT_TRUE(close(to_host(a_v), want_v, kStateTol)) << "v";
    EXPECT_NE(got, param);
    EXPECT_EQ(got, to_host(b_param));
    EXPECT_EQ(to_host(a_m), to_host(b_m));
    EXPECT_EQ(to_host(a_v), to_host(b_v));
    const std::vector<float> out = to_host(a_out), ref_out = to_host(b_out);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_TRUE(out[i] == ref_out[i] || (std::isnan(out[i]) && std::isnan(ref_out[i]))) << i;
  }
}

// gpu::decide_step computes st::decide_step's bits on the device: clipped, unclipped, fp16-scaled, no clip, and the
// non-finite cases that skip.
TEST(DecideStepGpu, MatchesHost) {
  ST_SKIP_WITHOUT_GPU();
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    double sq, loss, loss_scale;
    float clip;
  };
  const Case cases[] = {{16.0, 3.5, 1.0, 1.0f},    {0.25, 3.5, 1.0, 1.0f},   {1.7e7, 2.0, 1024.0, 1.0f},
                        {123.456, 7.0, 1.0, 0.0f}, {2.0, 1.0, 1.0, 0.3f},    {inf, 3.5, 1.0, 1.0f},
                        {nan, 3.5, 1.0, 1.0f},     {16.0, inf, 1.0, 1.0f},   {16.0, nan, 65536.0, 1.0f},
                        {0.0, 0.0, 1.0, 1.0f},     {3.3e-12, 5.5, 1.0, 1.0f}};
  test::GpuEnv env;
  DeviceBuffer<double> sums(2);
  DeviceBuffer<StepGate> out(1);
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "sq=" << c.sq << " loss=" << c.loss << " scale=" << c.loss_scale
                                      << " clip=" << c.clip);
    const double host_sums[2] = {c.sq, c.loss};
    ST_CUDA_CHECK(cudaMemcpy(sums.data(), host_sums, sizeof(host_sums), cudaMemcpyHostToDevice));
    ST_CUDA_CHECK(cudaDeviceSynchronize());  // see to_device in tests/common/gpu_test.h
    gpu::decide_step(sums.data(), c.loss_scale, c.clip, out.data(), env.ctx);
    env.stream.synchronize();  // the copy below is on the legacy stream, which does not wait for env's
    StepGate got;
    ST_CUDA_CHECK(cudaMemcpy(&got, out.data(), sizeof(StepGate), cudaMemcpyDeviceToHost));
    const StepGate want = decide_step(c.sq, c.loss, c.loss_scale, c.clip);
    EXPECT_EQ(got.skip, want.skip);
    EXPECT_EQ(got.grad_scale, want.grad_scale);
    if (std::isnan(want.grad_norm))
      EXPECT_TRUE(std::isnan(got.grad_norm));
    else
      EXPECT_EQ(got.grad_norm, want.grad_norm);
  }
}

}  // namespace
}  // namespace st
