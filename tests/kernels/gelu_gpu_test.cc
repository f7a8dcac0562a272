// gpu::gelu_* and gpu::residual_forward against the CPU references in st.
#include <gtest/gtest.h>

#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/gelu.h"
#include "shardtrain/kernels/gpu/gelu.h"

namespace st {
namespace {

using test::close;
using test::kTol;
using test::to_device;
using test::to_host;

// n elements starting `offset` elements into each buffer: a non-zero offset misaligns every pointer and
// so takes the scalar path; n % 8 != 0 leaves a tail after the packs.
struct Shape {
  int64_t n;
  int offset;
};
const Shape kShapes[] = {{1, 0}, {7, 0}, {1000, 0}, {4099, 0}, {4099, 1}, {100003, 0}};

template <typename T>
class GeluGpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(GeluGpuTest, test::ActivationTypes, test::ActivationNames);

TYPED_TEST(GeluGpuTest, ForwardMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " offset=" << s.offset);
    const std::vector<float> inp = test::random_input<T>(s.n, 1, 2.0f);
    std::vector<float> want(s.n);
    gelu_forward(want.data(), inp.data(), s.n);

    test::GpuEnv env;
    DeviceBuffer<T> d_inp = test::upload<T>(inp, s.offset);
    DeviceBuffer<T> out(s.offset + s.n);
    test::poison(out);
    gpu::gelu_forward<T>(out.data() + s.offset, d_inp.data() + s.offset, s.n, env.ctx);
    EXPECT_TRUE(close(test::download(out, s.offset), want, kTol<T>));
  }
}

TYPED_TEST(GeluGpuTest, BackwardAccumulatesLikeCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " offset=" << s.offset);
    const std::vector<float> inp = test::random_input<T>(s.n, 1, 2.0f);
    const std::vector<float> dout = test::random_input<T>(s.n, 2);
    std::vector<float> dinp = test::random_input<T>(s.n, 3);  // non-zero start: the kernel accumulates
    test::GpuEnv env;
    DeviceBuffer<T> d_inp = test::upload<T>(inp, s.offset), d_dout = test::upload<T>(dout, s.offset);
    DeviceBuffer<T> d_dinp = test::upload<T>(dinp, s.offset);
    gelu_backward(dinp.data(), inp.data(), dout.data(), s.n);

    gpu::gelu_backward<T>(d_dinp.data() + s.offset, d_inp.data() + s.offset, d_dout.data() + s.offset, s.n, env.ctx);
    EXPECT_TRUE(close(test::download(d_dinp, s.offset), dinp, kTol<T>));
  }
}

// kOverwrite on a poisoned buffer, and in place on dout: the same values as accumulating into zeros.
TYPED_TEST(GeluGpuTest, BackwardOverwritesInPlace) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " offset=" << s.offset);
    const std::vector<float> inp = test::random_input<T>(s.n, 4, 2.0f);
    const std::vector<float> dout = test::random_input<T>(s.n, 5);
    std::vector<float> want(s.n, 0.0f);
    gelu_backward(want.data(), inp.data(), dout.data(), s.n);
    test::GpuEnv env;
    DeviceBuffer<T> d_inp = test::upload<T>(inp, s.offset), d_dout = test::upload<T>(dout, s.offset);
    DeviceBuffer<T> fresh(s.offset + s.n);
    test::poison(fresh);
    gpu::gelu_backward<T>(fresh.data() + s.offset, d_inp.data() + s.offset, d_dout.data() + s.offset, s.n, env.ctx,
                          GradWrite::kOverwrite);
    EXPECT_TRUE(close(test::download(fresh, s.offset), want, kTol<T>));
    gpu::gelu_backward<T>(d_dout.data() + s.offset, d_inp.data() + s.offset, d_dout.data() + s.offset, s.n, env.ctx,
                          GradWrite::kOverwrite);
    EXPECT_TRUE(test::bitwise_equal(test::download(d_dout, s.offset), test::download(fresh, s.offset)));
  }
}

// out separate, out aliasing a, out aliasing b.
enum class Alias { kNone, kA, kB };

TYPED_TEST(GeluGpuTest, ResidualMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    for (Alias alias : {Alias::kNone, Alias::kA, Alias::kB}) {
      SCOPED_TRACE(::testing::Message() << "n=" << s.n << " offset=" << s.offset
                                        << " alias=" << static_cast<int>(alias));
      const std::vector<float> a = test::random_input<T>(s.n, 1), b = test::random_input<T>(s.n, 2);
      std::vector<float> want(s.n);
      residual_forward(want.data(), a.data(), b.data(), s.n);

      test::GpuEnv env;
      DeviceBuffer<T> d_a = test::upload<T>(a, s.offset), d_b = test::upload<T>(b, s.offset), d_out(s.offset + s.n);
      test::poison(d_out);
      DeviceBuffer<T>& out = alias == Alias::kA ? d_a : (alias == Alias::kB ? d_b : d_out);
      gpu::residual_forward<T>(out.data() + s.offset, d_a.data() + s.offset, d_b.data() + s.offset, s.n, env.ctx);
      EXPECT_TRUE(close(test::download(out, s.offset), want, kTol<T>));
    }
  }
}

}  // namespace
}  // namespace st
