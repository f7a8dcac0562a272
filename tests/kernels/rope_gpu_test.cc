// gpu::rope_* against the CPU reference st::rope_*.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/gpu/rope.h"
#include "shardtrain/kernels/rope.h"

namespace st {
namespace {

using test::kTol;
using test::to_device;

struct Shape {
  int B, T, NH, NKV, hs;
  int offset;  // elements of padding before qkv: 1 misaligns it, for the scalar path
};
// hs/2 = 1 and 3: not a multiple of any pack, the scalar path. hs/2 = 4: packed in fp32 only (4 floats a pack,
// 8 bf16/fp16). hs/2 = 8, 32, 64: packed in every type, unless offset 1 misaligns qkv. NKV < NH: grouped-query
// attention (8 / 2, 32 / 8 as Llama 3 8B), and NKV = 1 (multi-query).
const Shape kShapes[] = {{1, 1, 1, 1, 2, 0},   {2, 5, 4, 4, 6, 0},   {2, 7, 12, 4, 8, 0},   {2, 17, 4, 2, 16, 0},
                         {1, 33, 8, 2, 64, 0}, {1, 33, 8, 2, 64, 1}, {3, 64, 6, 1, 128, 0}, {1, 300, 32, 8, 128, 0}};

// One problem: q, k and v heads of scale 2, and the llama3-scaled table of Llama 3.1 for T positions.
template <typename T>
struct Problem {
  explicit Problem(const Shape& s) : qkv(test::random_input<T>(rows(s) * width(s), 1, 2.0f)) {
    ModelConfig cfg;
    cfg.n_head = s.NH;
    cfg.n_kv_head = s.NKV;
    cfg.n_embd = s.NH * s.hs;
    cfg.rope_theta = 500000.0f;
    cfg.rope_scaling = RopeScaling::kLlama3;
    const RopeTable table = rope_table(cfg, s.T);
    cos = table.cos;
    sin = table.sin;
  }
  static int64_t rows(const Shape& s) { return int64_t{s.B} * s.T; }
  static int64_t width(const Shape& s) { return int64_t{s.NH + 2 * s.NKV} * s.hs; }
  std::vector<float> qkv, cos, sin;
};

enum class Direction { kForward, kBackward };

// The rotation of p.qkv (kForward) or of the gradient p.qkv (kBackward): {CPU, GPU}.
template <typename T>
std::pair<std::vector<float>, std::vector<float>> rotate_both(const Shape& s, const Problem<T>& p, Direction dir) {
  std::vector<float> want = p.qkv;
  test::GpuEnv env;
  DeviceBuffer<T> qkv = test::upload<T>(p.qkv, s.offset);
  DeviceBuffer<float> cos = to_device<float>(p.cos), sin = to_device<float>(p.sin);
  if (dir == Direction::kForward) {
    rope_forward(want.data(), p.cos.data(), p.sin.data(), s.B, s.T, s.NH, s.NKV, s.hs);
    gpu::rope_forward<T>(qkv.data() + s.offset, cos.data(), sin.data(), s.B, s.T, s.NH, s.NKV, s.hs, env.ctx);
  } else {
    rope_backward(want.data(), p.cos.data(), p.sin.data(), s.B, s.T, s.NH, s.NKV, s.hs);
    gpu::rope_backward<T>(qkv.data() + s.offset, cos.data(), sin.data(), s.B, s.T, s.NH, s.NKV, s.hs, env.ctx);
  }
  return {want, test::download(qkv, s.offset)};
}

// The value heads of every row, which neither direction may touch: [rows, NKV * hs].
std::vector<float> value_heads(const std::vector<float>& qkv, const Shape& s) {
  const int64_t width = int64_t{s.NH + 2 * s.NKV} * s.hs, v0 = int64_t{s.NH + s.NKV} * s.hs;
  std::vector<float> v;
  for (int64_t r = 0; r < int64_t{s.B} * s.T; ++r)
    v.insert(v.end(), qkv.begin() + r * width + v0, qkv.begin() + (r + 1) * width);
  return v;
}

template <typename T>
class RopeGpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(RopeGpuTest, test::ActivationTypes, test::ActivationNames);

// Each output is x cos - y sin (or its transpose) of the same operands in fp32 on both sides, each product rounded on
// its own (no fused multiply-add on either side), then rounded once to T: the CPU's values rounded to T, bit for bit.
// Both directions, in place; the value heads, which neither may touch, keep their bits.
TYPED_TEST(RopeGpuTest, ForwardAndBackwardMatchCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    for (Direction dir : {Direction::kForward, Direction::kBackward}) {
      SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV
                                        << " hs=" << s.hs << " offset=" << s.offset
                                        << (dir == Direction::kForward ? " forward" : " backward"));
      const Problem<T> p(s);
      const auto [want, got] = rotate_both(s, p, dir);
      EXPECT_TRUE(test::bitwise_equal(got, test::round_through<T>(want)));
      EXPECT_TRUE(test::bitwise_equal(value_heads(got, s), value_heads(p.qkv, s))) << "value heads";
    }
  }
}

// The backward's amax (the optional output that the q/k/v projection's tensorwise FP8 cast of dqkv reads instead of a
// pass of its own): the tensorwise maximum of the whole of dqkv after the rotation, the value heads included, as
// fp8_maxima takes it of the stored values, bit for bit, and within kTol of the CPU reference's amax; here a value
// head holds the largest magnitude, then a query head does. The rotation keeps the bits of a run without it.
TYPED_TEST(RopeGpuTest, BackwardAmaxIsTheMaximumOfTheWholeGradient) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    const int64_t width = Problem<T>::width(s), last_value = width - 1, first_query = (Problem<T>::rows(s) - 1) * width;
    for (const int64_t at : {last_value, first_query}) {
      SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV
                                        << " hs=" << s.hs << " offset=" << s.offset << " large at " << at);
      Problem<T> p(s);
      p.qkv[static_cast<size_t>(at)] = at == last_value ? -50.0f : 60.0f;
      test::GpuEnv env;
      DeviceBuffer<T> plain = test::upload<T>(p.qkv, s.offset), qkv = test::upload<T>(p.qkv, s.offset);
      DeviceBuffer<float> cos = to_device<float>(p.cos), sin = to_device<float>(p.sin);
      gpu::rope_backward<T>(plain.data() + s.offset, cos.data(), sin.data(), s.B, s.T, s.NH, s.NKV, s.hs, env.ctx);
      test::DeviceMaximum amax;
      gpu::rope_backward<T>(qkv.data() + s.offset, cos.data(), sin.data(), s.B, s.T, s.NH, s.NKV, s.hs, env.ctx,
                            amax.data());
      const std::vector<float> got = test::download(qkv, s.offset);
      EXPECT_TRUE(test::bitwise_equal(got, test::download(plain, s.offset)));
      std::vector<float> want = p.qkv;
      unsigned cpu = 0;
      rope_backward(want.data(), p.cos.data(), p.sin.data(), s.B, s.T, s.NH, s.NKV, s.hs, &cpu);
      EXPECT_TRUE(test::maximum_matches(amax.bits(), got, cpu, kTol<T>));
      if (at == last_value) EXPECT_EQ(amax.bits(), testing::maximum_bits(50.0f));
    }
  }
}

// Non-finite values count as the maxima pass counts them (gpu::fp8_maxima_async of dqkv): an infinity in a query
// head, a NaN in a value head (which the backward only reads). Float and bf16, the types FP8 casts read.
template <typename T>
void expect_non_finite_maxima() {
  for (const Shape& s : {kShapes[1], kShapes[4], kShapes[5], kShapes[7]})
    for (const float bad : {INFINITY, NAN}) {
      SCOPED_TRACE(::testing::Message() << "NH=" << s.NH << " NKV=" << s.NKV << " hs=" << s.hs << " offset=" << s.offset
                                        << " " << bad);
      Problem<T> p(s);
      const int64_t width = Problem<T>::width(s);
      p.qkv[static_cast<size_t>(std::isnan(bad) ? 2 * width - 1 : width)] = bad;  // row 1's last value, first query
      test::GpuEnv env;
      DeviceBuffer<T> qkv = test::upload<T>(p.qkv, s.offset);
      DeviceBuffer<float> cos = to_device<float>(p.cos), sin = to_device<float>(p.sin);
      test::DeviceMaximum amax;
      gpu::rope_backward<T>(qkv.data() + s.offset, cos.data(), sin.data(), s.B, s.T, s.NH, s.NKV, s.hs, env.ctx,
                            amax.data());
      EXPECT_TRUE(test::non_finite_bits(amax.bits())) << std::hex << amax.bits();
      EXPECT_EQ(amax.bits(),
                test::device_maximum(qkv.data() + s.offset, Problem<T>::rows(s) * Problem<T>::width(s), env.ctx));
    }
}

TEST(RopeGpu, BackwardAmaxTakesNonFiniteValuesAsTheMaximaPass) {
  ST_SKIP_WITHOUT_GPU();
  expect_non_finite_maxima<float>();
  expect_non_finite_maxima<bf16>();
}

// Forward then backward on the device gives the input back: in fp32 to the rounding of two rotations (|cos|, |sin|
// <= 1, so a few ulps of the pair's magnitude: 1e-6 of max|x|); in bf16/fp16 the intermediate is rounded to T,
// within kTol.
TYPED_TEST(RopeGpuTest, BackwardUndoesForward) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const Shape s = {2, 17, 4, 2, 16, 0};
  const Problem<T> p(s);
  test::GpuEnv env;
  DeviceBuffer<T> qkv = to_device<T>(p.qkv);
  DeviceBuffer<float> cos = to_device<float>(p.cos), sin = to_device<float>(p.sin);
  gpu::rope_forward<T>(qkv.data(), cos.data(), sin.data(), s.B, s.T, s.NH, s.NKV, s.hs, env.ctx);
  const std::vector<float> turned = test::to_host(qkv);
  EXPECT_FALSE(test::bitwise_equal(turned, p.qkv)) << "positions past 0 turn";
  gpu::rope_backward<T>(qkv.data(), cos.data(), sin.data(), s.B, s.T, s.NH, s.NKV, s.hs, env.ctx);
  float amax = 0;
  for (float x : p.qkv) amax = std::max(amax, std::fabs(x));
  EXPECT_TRUE(test::all_close(test::to_host(qkv), p.qkv, std::is_same_v<T, float> ? 1e-6 : kTol<T>, amax));
}

}  // namespace
}  // namespace st
