// gpu::gelu_* and gpu::residual_forward against the CPU references in st.
#include <gtest/gtest.h>

#include <cmath>
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

// amax (the optional output that a linear layer's tensorwise FP8 cast reads instead of a pass of its own): out's
// tensorwise maximum as fp8_maxima takes it of the stored values, bit for bit, and within kTol of the CPU reference's
// amax; out keeps the bits of a run without it.
TYPED_TEST(GeluGpuTest, ForwardAmaxIsTheMaximumOfItsOutput) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "n=" << s.n << " offset=" << s.offset);
    const std::vector<float> inp = test::random_input<T>(s.n, 1, 2.0f);
    std::vector<float> want(s.n);
    unsigned cpu = 0;
    gelu_forward(want.data(), inp.data(), s.n, &cpu);
    test::GpuEnv env;
    DeviceBuffer<T> d_inp = test::upload<T>(inp, s.offset);
    DeviceBuffer<T> plain(s.offset + s.n), out(s.offset + s.n);
    gpu::gelu_forward<T>(plain.data() + s.offset, d_inp.data() + s.offset, s.n, env.ctx);
    test::DeviceMaximum amax;
    gpu::gelu_forward<T>(out.data() + s.offset, d_inp.data() + s.offset, s.n, env.ctx, amax.data());
    const std::vector<float> got = test::download(out, s.offset);
    EXPECT_TRUE(test::bitwise_equal(got, test::download(plain, s.offset)));
    EXPECT_TRUE(test::maximum_matches(amax.bits(), got, cpu, kTol<T>));
  }
}

// Non-finite values count as the maxima pass counts them (gpu::fp8_maxima_async of out): a NaN input, an infinite
// one. Float and bf16, the types FP8 casts read.
template <typename T>
void expect_non_finite_maxima() {
  for (const Shape& s : kShapes)
    for (const float bad : {NAN, INFINITY}) {
      SCOPED_TRACE(::testing::Message() << "n=" << s.n << " offset=" << s.offset << " " << bad);
      std::vector<float> inp = test::random_input<T>(s.n, 1, 2.0f);
      inp[static_cast<size_t>(s.n / 2)] = bad;
      test::GpuEnv env;
      DeviceBuffer<T> d_inp = test::upload<T>(inp, s.offset), out(s.offset + s.n);
      test::DeviceMaximum amax;
      gpu::gelu_forward<T>(out.data() + s.offset, d_inp.data() + s.offset, s.n, env.ctx, amax.data());
      EXPECT_TRUE(test::non_finite_bits(amax.bits())) << std::hex << amax.bits();
      EXPECT_EQ(amax.bits(), test::device_maximum(out.data() + s.offset, s.n, env.ctx));
    }
}

TEST(GeluGpu, ForwardAmaxTakesNonFiniteValuesAsTheMaximaPass) {
  ST_SKIP_WITHOUT_GPU();
  expect_non_finite_maxima<float>();
  expect_non_finite_maxima<bf16>();
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
