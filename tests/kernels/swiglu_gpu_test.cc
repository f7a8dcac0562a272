// gpu::swiglu_* against the CPU reference st::swiglu_*.
#include <gtest/gtest.h>

#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/gpu/swiglu.h"
#include "shardtrain/kernels/swiglu.h"

namespace st {
namespace {

using test::close;
using test::kTol;

struct Shape {
  int64_t N;
  int F;
  int offset;  // elements of padding before every buffer: 1 misaligns them, for the scalar path
};
// F = 1, 7, 13: not a multiple of any pack, the scalar path. F = 4, 12: packed in fp32 only (4 floats a pack, 8
// bf16/fp16). F = 64, 344, 14336 (Llama 3 8B's): packed in every type, unless offset 1 misaligns the buffers.
const Shape kShapes[] = {{1, 1, 0},   {3, 7, 0},   {5, 4, 0},     {9, 12, 0},   {37, 13, 0},
                         {50, 64, 0}, {50, 64, 1}, {301, 344, 0}, {4, 14336, 0}};

// gate_up with gates of scale 3 (into both tails of the sigmoid) and up of scale 1; dout of scale 1. On the host and,
// after s.offset elements of padding, on the device.
template <typename T>
struct Problem {
  explicit Problem(const Shape& s) : s(s), gate_up(s.N * 2 * s.F), dout(test::random_input<T>(s.N * s.F, 3)) {
    const std::vector<float> gate = test::random_input<T>(s.N * s.F, 1, 3.0f), up = test::random_input<T>(s.N * s.F, 2);
    for (int64_t n = 0; n < s.N; ++n) {
      for (int f = 0; f < s.F; ++f) {
        gate_up[n * 2 * s.F + f] = gate[n * s.F + f];
        gate_up[n * 2 * s.F + s.F + f] = up[n * s.F + f];
      }
    }
    d_gate_up = test::upload<T>(gate_up, s.offset);
    d_dout = test::upload<T>(dout, s.offset);
  }
  // gpu::swiglu_backward into `into` (padded as the operands), from the device operands.
  void backward(DeviceBuffer<T>& into, const gpu::GpuContext& ctx, GradWrite write = GradWrite::kOverwrite) const {
    gpu::swiglu_backward<T>(into.data() + s.offset, d_dout.data() + s.offset, d_gate_up.data() + s.offset, s.N, s.F,
                            ctx, write);
  }
  Shape s;
  std::vector<float> gate_up, dout;
  DeviceBuffer<T> d_gate_up, d_dout;
};

template <typename T>
class SwigluGpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(SwigluGpuTest, test::ActivationTypes, test::ActivationNames);

// Tolerances (kTol, gpu_kernel_test.h): the same fp32 formula of the same operands on both sides, so fp32 outputs
// differ by a few ulps of expf and a fused multiply-add (1e-5); bf16 and fp16 outputs are that value rounded once to
// T (accumulated gradients: the sum with the T-rounded start, rounded once), a relative 2^-9 or 2^-12 at most,
// within 1e-2.
TYPED_TEST(SwigluGpuTest, ForwardMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " F=" << s.F << " offset=" << s.offset);
    const Problem<T> p(s);
    std::vector<float> want(s.N * s.F);
    swiglu_forward(want.data(), p.gate_up.data(), s.N, s.F);
    test::GpuEnv env;
    DeviceBuffer<T> out(s.offset + s.N * s.F);
    test::poison(out);
    gpu::swiglu_forward<T>(out.data() + s.offset, p.d_gate_up.data() + s.offset, s.N, s.F, env.ctx);
    EXPECT_TRUE(close(test::download(out, s.offset), want, kTol<T>));
  }
}

// kOverwrite (the default) into a poisoned buffer, kAccumulate into a non-zero one, and kOverwrite in place on
// gate_up (the activation is no longer needed once its gradient is formed): the in-place result has the bits of the
// separate one, as each element's inputs are read before its outputs are written.
TYPED_TEST(SwigluGpuTest, BackwardOverwritesAccumulatesOrReplacesLikeCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " F=" << s.F << " offset=" << s.offset);
    Problem<T> p(s);
    test::GpuEnv env;
    std::vector<float> want(s.N * 2 * s.F);
    swiglu_backward(want.data(), p.dout.data(), p.gate_up.data(), s.N, s.F);
    DeviceBuffer<T> fresh(s.offset + s.N * 2 * s.F);
    test::poison(fresh);
    p.backward(fresh, env.ctx);
    const std::vector<float> got = test::download(fresh, s.offset);
    EXPECT_TRUE(close(got, want, kTol<T>)) << "overwrite";

    std::vector<float> acc = test::random_input<T>(s.N * 2 * s.F, 4);
    DeviceBuffer<T> d_acc = test::upload<T>(acc, s.offset);
    swiglu_backward(acc.data(), p.dout.data(), p.gate_up.data(), s.N, s.F, GradWrite::kAccumulate);
    p.backward(d_acc, env.ctx, GradWrite::kAccumulate);
    EXPECT_TRUE(close(test::download(d_acc, s.offset), acc, kTol<T>)) << "accumulate";

    p.backward(p.d_gate_up, env.ctx);
    EXPECT_TRUE(test::bitwise_equal(test::download(p.d_gate_up, s.offset), got)) << "in place";
  }
}

}  // namespace
}  // namespace st
