// gpu::swiglu_* against the CPU reference st::swiglu_*.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/gpu/fp8.h"
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

// amax (the optional output that a linear layer's tensorwise FP8 cast reads instead of a pass of its own): the
// tensorwise maximum of out, and of dgate_up written or as accumulated, as fp8_maxima takes it of the stored values,
// bit for bit, and within kTol of the CPU reference's amax; the outputs keep the bits of a run without it.
TYPED_TEST(SwigluGpuTest, AmaxIsTheMaximumOfWhatItWrites) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " F=" << s.F << " offset=" << s.offset);
    const Problem<T> p(s);
    test::GpuEnv env;
    DeviceBuffer<T> plain(s.offset + s.N * s.F), out(s.offset + s.N * s.F);
    gpu::swiglu_forward<T>(plain.data() + s.offset, p.d_gate_up.data() + s.offset, s.N, s.F, env.ctx);
    test::DeviceMaximum amax;
    gpu::swiglu_forward<T>(out.data() + s.offset, p.d_gate_up.data() + s.offset, s.N, s.F, env.ctx, amax.data());
    const std::vector<float> got = test::download(out, s.offset);
    EXPECT_TRUE(test::bitwise_equal(got, test::download(plain, s.offset))) << "out";
    std::vector<float> cpu_out(s.N * s.F);
    unsigned cpu = 0;
    swiglu_forward(cpu_out.data(), p.gate_up.data(), s.N, s.F, &cpu);
    EXPECT_TRUE(test::maximum_matches(amax.bits(), got, cpu, kTol<T>)) << "forward";

    for (GradWrite write : {GradWrite::kOverwrite, GradWrite::kAccumulate}) {
      const char* what = write == GradWrite::kOverwrite ? "overwrite" : "accumulate";
      const std::vector<float> start = test::random_input<T>(s.N * 2 * s.F, 4);
      DeviceBuffer<T> dplain = test::upload<T>(start, s.offset), d = test::upload<T>(start, s.offset);
      p.backward(dplain, env.ctx, write);
      test::DeviceMaximum damax;
      gpu::swiglu_backward<T>(d.data() + s.offset, p.d_dout.data() + s.offset, p.d_gate_up.data() + s.offset, s.N, s.F,
                              env.ctx, write, damax.data());
      const std::vector<float> dgot = test::download(d, s.offset);
      EXPECT_TRUE(test::bitwise_equal(dgot, test::download(dplain, s.offset))) << what;
      std::vector<float> cpu_d = start;
      unsigned dcpu = 0;
      swiglu_backward(cpu_d.data(), p.dout.data(), p.gate_up.data(), s.N, s.F, write, &dcpu);
      EXPECT_TRUE(test::maximum_matches(damax.bits(), dgot, dcpu, kTol<T>)) << what;
    }
  }
}

// Non-finite values count as the maxima pass counts them (gpu::fp8_maxima_async of the output): a NaN gate, an
// infinite up. Float and bf16, the types FP8 casts read.
template <typename T>
void expect_non_finite_maxima() {
  for (const float bad : {NAN, INFINITY})
    for (const Shape& s : {Shape{3, 7, 0}, Shape{50, 64, 0}, Shape{301, 344, 0}}) {
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " F=" << s.F << " " << bad);
      Problem<T> p(s);
      p.gate_up[std::isnan(bad) ? 1 : s.F + 1] = bad;  // row 0's gate 1, or its up 1
      p.d_gate_up = test::upload<T>(p.gate_up, s.offset);
      test::GpuEnv env;
      DeviceBuffer<T> out(s.N * s.F), d(s.N * 2 * s.F);
      test::DeviceMaximum amax, damax;
      gpu::swiglu_forward<T>(out.data(), p.d_gate_up.data(), s.N, s.F, env.ctx, amax.data());
      EXPECT_TRUE(test::non_finite_bits(amax.bits())) << std::hex << amax.bits();
      EXPECT_EQ(amax.bits(), test::device_maximum(out.data(), s.N * s.F, env.ctx)) << "forward";
      gpu::swiglu_backward<T>(d.data(), p.d_dout.data(), p.d_gate_up.data(), s.N, s.F, env.ctx, GradWrite::kOverwrite,
                              damax.data());
      EXPECT_TRUE(test::non_finite_bits(damax.bits())) << std::hex << damax.bits();
      EXPECT_EQ(damax.bits(), test::device_maximum(d.data(), s.N * 2 * s.F, env.ctx)) << "backward";
    }
}

TEST(SwigluGpu, AmaxTakesNonFiniteValuesAsTheMaximaPass) {
  ST_SKIP_WITHOUT_GPU();
  expect_non_finite_maxima<float>();
  expect_non_finite_maxima<bf16>();
}

// gpu::swiglu_forward_fp8 writes the bits of the unfused path it replaces: swiglu_forward<T>'s out cast with the same
// maximum by gpu::fp8_quantize_pair_with_maxima_async (codes in both layouts, inverse scale) and swiglu_forward's
// amax, on the tiles (N and F multiples of 8, partial tiles both ways) and on the any-shape path (odd shapes, a
// misaligned buffer), with either layout left out; against the CPU reference st::swiglu_forward_fp8 each code within
// one step of the CPU's (the two sides' expf may differ in the last bit, and bf16's out is rounded before its cast).
// Float and bf16, the types FP8 casts read; both formats; a given maximum of out's own and of a quarter of it
// (saturating).
template <typename T>
void expect_fused_cast_as_unfused() {
  for (const Shape& s :
       {Shape{3, 7, 0}, Shape{16, 24, 0}, Shape{48, 64, 0}, Shape{48, 64, 1}, Shape{136, 344, 0}, Shape{264, 136, 0}})
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (float part : {1.0f, 0.25f}) {
        SCOPED_TRACE(::testing::Message()
                     << "N=" << s.N << " F=" << s.F << " offset " << s.offset << " " << to_string(f) << " x" << part);
        const Problem<T> p(s);
        test::GpuEnv env(gpu::fp8_quantize_scratch_bytes(2));
        const int64_t n = s.N * s.F;
        DeviceBuffer<T> out(n);
        test::DeviceMaximum out_max;
        gpu::swiglu_forward<T>(out.data(), p.d_gate_up.data() + s.offset, s.N, s.F, env.ctx, out_max.data());
        float m = 0.0f;
        const unsigned own_bits = out_max.bits();
        std::memcpy(&m, &own_bits, sizeof(m));
        m *= part;
        unsigned given = 0;
        std::memcpy(&given, &m, sizeof(given));
        const DeviceBuffer<unsigned> amax = test::ints_to_device(std::vector<unsigned>{given});
        const test::UnfusedCast<T> want(out.data(), s.N, s.F, f, given, env);
        DeviceBuffer<uint8_t> q(n + 1), q_t(n);
        DeviceBuffer<float> inv(1);
        test::DeviceMaximum own;
        // q one byte in where the shape is misaligned (offset 1): the any-shape path.
        uint8_t* q_at = q.data() + s.offset;
        gpu::swiglu_forward_fp8<T>(q_at, q_t.data(), inv.data(), own.data(), p.d_gate_up.data() + s.offset, s.N, s.F, f,
                                   amax.data(), env.ctx);
        const std::vector<uint8_t> got = test::ints_to_host(q), got_t = test::ints_to_host(q_t);
        EXPECT_EQ(std::vector<uint8_t>(got.begin() + s.offset, got.begin() + s.offset + n), want.q);
        EXPECT_EQ(got_t, want.q_t);
        EXPECT_EQ(test::ints_to_host(inv)[0], want.inverse);
        EXPECT_EQ(own.bits(), own_bits);
        DeviceBuffer<uint8_t> only(n);
        gpu::swiglu_forward_fp8<T>(nullptr, only.data(), inv.data(), nullptr, p.d_gate_up.data() + s.offset, s.N, s.F,
                                   f, amax.data(), env.ctx);
        EXPECT_EQ(test::ints_to_host(only), got_t);
        DeviceBuffer<uint8_t> row_only(n + 1);  // the other layout alone (the tiles' early return)
        gpu::swiglu_forward_fp8<T>(row_only.data() + s.offset, nullptr, inv.data(), nullptr,
                                   p.d_gate_up.data() + s.offset, s.N, s.F, f, amax.data(), env.ctx);
        const std::vector<uint8_t> rows = test::ints_to_host(row_only);
        EXPECT_TRUE(std::equal(rows.begin() + s.offset, rows.begin() + s.offset + n, got.begin() + s.offset));
        // The CPU reference on the same (T-rounded) operands.
        std::vector<uint8_t> cpu(static_cast<size_t>(n));
        float cpu_inv = 0;
        swiglu_forward_fp8(cpu.data(), nullptr, &cpu_inv, nullptr, p.gate_up.data(), s.N, s.F, f, &given);
        EXPECT_EQ(cpu_inv, test::ints_to_host(inv)[0]);
        EXPECT_EQ(test::codes_over_a_step_apart(cpu, got, s.offset), 0);
      }
}

// gpu::swiglu_backward_fp8 likewise: the bits of swiglu_backward<T>'s dgate_up (written) cast with the same maximum,
// on the tiles and the any-shape path, either layout alone; the CPU reference's codes within one step.
template <typename T>
void expect_fused_grad_cast_as_unfused() {
  for (const Shape& s :
       {Shape{3, 7, 0}, Shape{16, 24, 0}, Shape{48, 64, 0}, Shape{48, 64, 1}, Shape{136, 344, 0}, Shape{264, 136, 0}})
    for (Fp8Format f : {Fp8Format::kE5M2, Fp8Format::kE4M3}) {
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " F=" << s.F << " offset " << s.offset << " "
                                        << to_string(f));
      const Problem<T> p(s);
      test::GpuEnv env(gpu::fp8_quantize_scratch_bytes(2));
      const int64_t n = s.N * 2 * s.F;
      DeviceBuffer<T> grad(n);
      test::DeviceMaximum grad_max;
      gpu::swiglu_backward<T>(grad.data(), p.d_dout.data() + s.offset, p.d_gate_up.data() + s.offset, s.N, s.F, env.ctx,
                              GradWrite::kOverwrite, grad_max.data());
      const unsigned given = grad_max.bits();
      const DeviceBuffer<unsigned> amax = test::ints_to_device(std::vector<unsigned>{given});
      const test::UnfusedCast<T> want(grad.data(), s.N, 2 * s.F, f, given, env);
      DeviceBuffer<uint8_t> q(n + 1), q_t(n), only(n);
      DeviceBuffer<float> inv(1);
      test::DeviceMaximum own;
      gpu::swiglu_backward_fp8<T>(q.data() + s.offset, q_t.data(), inv.data(), own.data(), p.d_dout.data() + s.offset,
                                  p.d_gate_up.data() + s.offset, s.N, s.F, f, amax.data(), env.ctx);
      const std::vector<uint8_t> got = test::ints_to_host(q), got_t = test::ints_to_host(q_t);
      EXPECT_EQ(std::vector<uint8_t>(got.begin() + s.offset, got.begin() + s.offset + n), want.q);
      EXPECT_EQ(got_t, want.q_t);
      EXPECT_EQ(test::ints_to_host(inv)[0], want.inverse);
      EXPECT_EQ(own.bits(), given);
      gpu::swiglu_backward_fp8<T>(nullptr, only.data(), inv.data(), nullptr, p.d_dout.data() + s.offset,
                                  p.d_gate_up.data() + s.offset, s.N, s.F, f, amax.data(), env.ctx);
      EXPECT_EQ(test::ints_to_host(only), got_t);
      DeviceBuffer<uint8_t> row_only(n + 1);
      gpu::swiglu_backward_fp8<T>(row_only.data() + s.offset, nullptr, inv.data(), nullptr, p.d_dout.data() + s.offset,
                                  p.d_gate_up.data() + s.offset, s.N, s.F, f, amax.data(), env.ctx);
      const std::vector<uint8_t> rows = test::ints_to_host(row_only);
      EXPECT_TRUE(std::equal(rows.begin() + s.offset, rows.begin() + s.offset + n, got.begin() + s.offset));
      std::vector<uint8_t> cpu(static_cast<size_t>(n));
      float cpu_inv = 0;
      swiglu_backward_fp8(cpu.data(), nullptr, &cpu_inv, nullptr, p.dout.data(), p.gate_up.data(), s.N, s.F, f, &given);
      EXPECT_EQ(cpu_inv, test::ints_to_host(inv)[0]);
      EXPECT_EQ(test::codes_over_a_step_apart(cpu, got, s.offset), 0);
    }
}

TEST(SwigluGpu, Fp8CastsAsTheUnfusedPathsDo) {
  ST_SKIP_WITHOUT_GPU();
  expect_fused_cast_as_unfused<float>();
  expect_fused_cast_as_unfused<bf16>();
  expect_fused_grad_cast_as_unfused<float>();
  expect_fused_grad_cast_as_unfused<bf16>();
}

}  // namespace
}  // namespace st
