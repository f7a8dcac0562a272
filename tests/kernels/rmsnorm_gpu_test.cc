// gpu::rmsnorm_* against the CPU reference st::rmsnorm_*.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/gpu/column_sums.h"
#include "shardtrain/kernels/gpu/rmsnorm.h"
#include "shardtrain/kernels/rmsnorm.h"

namespace st {
namespace {

using test::close;
using test::kTol;
using test::to_device;
using test::to_host;

constexpr float kEps = 1e-5f;  // Llama 3's rms_norm_eps

struct Shape {
  int64_t N;
  int C;
};
// C = 1, 7, 13, 771: not a multiple of any pack, the scalar path. C = 4 and 12: packed in fp32 only (4 floats a pack,
// 8 bf16/fp16). 64, 96, 768, 2048, 4096 (Llama 3 8B's width): packed in every type; 96 leaves some lanes a pack
// short of the others. dweight's row chunks are 8 rows up to N = 4096: N = 5 is one partial chunk, N = 103 and 2500
// end on a partial chunk, N = 9001 has 18-row chunks and a last chunk of one row.
const Shape kShapes[] = {{1, 1},   {1, 7},    {5, 64},    {37, 771},    {300, 96},   {1000, 7}, {64, 4},
                         {33, 12}, {70, 768}, {9001, 64}, {2500, 2048}, {103, 4096}, {17, 13}};

// One problem with its CPU forward (whose rstd both backward passes use). Rows have mean 0.5 and standard deviation
// 2: RMSNorm does not subtract the mean, so the rows should not be centred.
template <typename T>
struct Problem {
  explicit Problem(const Shape& s)
      : inp(test::random_input<T>(s.N * s.C, 1, 2.0f, 0.5f)),
        weight(test::random_input<T>(s.C, 2, 0.5f, 1.0f)),
        dout(test::random_input<T>(s.N * s.C, 3)),
        out(s.N * s.C),
        rstd(s.N) {
    rmsnorm_forward(out.data(), rstd.data(), inp.data(), weight.data(), kEps, s.N, s.C);
  }
  std::vector<float> inp, weight, dout, out, rstd;
};

// A problem's backward operands on the device, and gpu::rmsnorm_backward over them.
template <typename T>
struct DeviceBackward {
  DeviceBackward(const Problem<T>& p, const Shape& s)
      : N(s.N),
        C(s.C),
        dout(to_device<T>(p.dout)),
        inp(to_device<T>(p.inp)),
        weight(to_device<T>(p.weight)),
        rstd(to_device<float>(p.rstd)) {}
  void run(DeviceBuffer<T>& dinp, DeviceBuffer<T>& dweight, const gpu::GpuContext& ctx,
           GradWrite param_write = GradWrite::kAccumulate) const {
    gpu::rmsnorm_backward<T>(dinp.data(), dweight.data(), dout.data(), inp.data(), weight.data(), rstd.data(), N, C,
                             ctx, param_write);
  }
  // The backward accumulated into device copies of dinp0 and dweight0: {dinp, dweight} on the host.
  std::vector<std::vector<float>> outputs(const std::vector<float>& dinp0, const std::vector<float>& dweight0,
                                          const gpu::GpuContext& ctx) const {
    DeviceBuffer<T> dinp = to_device<T>(dinp0), dweight = to_device<T>(dweight0);
    run(dinp, dweight, ctx);
    if (ctx.column_sums) ctx.column_sums->finish(ctx.stream);
    return {to_host(dinp), to_host(dweight)};
  }
  int64_t N;
  int C;
  DeviceBuffer<T> dout, inp, weight;
  DeviceBuffer<float> rstd;
};

template <typename T>
class RmsNormGpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(RmsNormGpuTest, test::ActivationTypes, test::ActivationNames);

// Tolerances (kTol, gpu_kernel_test.h): the GPU sums in fp32 where the reference sums in double, so fp32 outputs
// differ by a few ulps of the sums (1e-5); bf16 and fp16 outputs are rounded once to T from such an fp32 value,
// a relative 2^-9 (bf16) or 2^-12 (fp16) at most, within 1e-2. rstd is fp32 whatever T is.
TYPED_TEST(RmsNormGpuTest, ForwardMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C);
    const Problem<T> p(s);
    test::GpuEnv env;
    DeviceBuffer<T> inp = to_device<T>(p.inp), weight = to_device<T>(p.weight);
    DeviceBuffer<T> out(s.N * s.C);
    DeviceBuffer<float> rstd(s.N);
    test::poison(out);
    test::poison(rstd);
    gpu::rmsnorm_forward<T>(out.data(), rstd.data(), inp.data(), weight.data(), kEps, s.N, s.C, env.ctx);
    EXPECT_TRUE(close(to_host(out), p.out, kTol<T>)) << "out";
    EXPECT_TRUE(close(to_host(rstd), p.rstd, kTol<float>)) << "rstd";
  }
}

TYPED_TEST(RmsNormGpuTest, BackwardAccumulatesLikeCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C);
    const Problem<T> p(s);
    // Non-zero starting gradients on both sides: the kernels accumulate.
    const std::vector<float> dinp0 = test::random_input<T>(s.N * s.C, 4), dweight0 = test::random_input<T>(s.C, 5);
    test::GpuEnv env(gpu::rmsnorm_backward_scratch_bytes(s.N, s.C));
    const std::vector<std::vector<float>> got = DeviceBackward<T>(p, s).outputs(dinp0, dweight0, env.ctx);
    std::vector<float> dinp = dinp0, dweight = dweight0;
    rmsnorm_backward(dinp.data(), dweight.data(), p.dout.data(), p.inp.data(), p.weight.data(), p.rstd.data(), s.N,
                     s.C);
    EXPECT_TRUE(close(got[0], dinp, kTol<T>)) << "dinp";
    EXPECT_TRUE(close(got[1], dweight, kTol<T>)) << "dweight";
  }
}

// param_write = kOverwrite: dweight, poisoned first, gets exactly what accumulating into a zeroed one gives
// (BackwardAccumulatesLikeCpu holds that against the CPU); dinp still accumulates, bit for bit as it does there.
TYPED_TEST(RmsNormGpuTest, BackwardOverwritesParamsOnRequest) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C);
    const Problem<T> p(s);
    const std::vector<float> dinp0 = test::random_input<T>(s.N * s.C, 6), zeros(s.C, 0.0f);
    test::GpuEnv env(gpu::rmsnorm_backward_scratch_bytes(s.N, s.C));
    const DeviceBackward<T> d(p, s);
    DeviceBuffer<T> add_dinp = to_device<T>(dinp0), add_dweight = to_device<T>(zeros);
    d.run(add_dinp, add_dweight, env.ctx);
    DeviceBuffer<T> dinp = to_device<T>(dinp0), dweight(s.C);
    test::poison(dweight);
    d.run(dinp, dweight, env.ctx, GradWrite::kOverwrite);
    EXPECT_TRUE(test::bitwise_equal(to_host(dinp), to_host(add_dinp))) << "dinp";
    EXPECT_TRUE(test::bitwise_equal(to_host(dweight), to_host(add_dweight))) << "dweight";
  }
}

TYPED_TEST(RmsNormGpuTest, BackwardIsDeterministic) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : {Shape{1000, 96}, Shape{777, 7}, Shape{2500, 2048}, Shape{9001, 64}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C);
    const std::vector<float> dinp0 = test::random_input<T>(s.N * s.C, 7), dweight0 = test::random_input<T>(s.C, 8);
    test::GpuEnv env(gpu::rmsnorm_backward_scratch_bytes(s.N, s.C));
    const DeviceBackward<T> d(Problem<T>(s), s);
    const std::vector<std::vector<float>> first = d.outputs(dinp0, dweight0, env.ctx),
                                          second = d.outputs(dinp0, dweight0, env.ctx);
    for (size_t i = 0; i < first.size(); ++i) EXPECT_TRUE(test::bitwise_equal(second[i], first[i])) << "output " << i;
  }
}

// With ctx.column_sums, dweight's partials go to the ColumnSums buffer and its finish adds them: the same bits as
// the immediate path, and the context's scratch (absent here) is not needed.
TYPED_TEST(RmsNormGpuTest, BackwardQueuedColumnSumsMatchImmediateBitwise) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : {Shape{300, 96}, Shape{37, 771}, Shape{2500, 2048}}) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C);
    const std::vector<float> dinp0 = test::random_input<T>(s.N * s.C, 9), dweight0 = test::random_input<T>(s.C, 10);
    const DeviceBackward<T> d(Problem<T>(s), s);
    test::GpuEnv env(gpu::rmsnorm_backward_scratch_bytes(s.N, s.C));
    const std::vector<std::vector<float>> want = d.outputs(dinp0, dweight0, env.ctx);
    gpu::ColumnSums sums(gpu::ColumnSums::reserved_bytes(gpu::rmsnorm_backward_scratch_bytes(s.N, s.C) / 4));
    gpu::GpuContext deferred{env.stream.get(), nullptr, nullptr, 0};
    deferred.column_sums = &sums;
    const std::vector<std::vector<float>> got = d.outputs(dinp0, dweight0, deferred);
    EXPECT_TRUE(sums.empty());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(test::bitwise_equal(got[i], want[i])) << "output " << i;
  }
}

// A frozen weight (dweight null): dinp gets the same bits as with a weight gradient, with no scratch and nothing queued
// on a ColumnSums.
TYPED_TEST(RmsNormGpuTest, BackwardWithoutDweightGivesTheSameDinp) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C);
    const std::vector<float> dinp0 = test::random_input<T>(s.N * s.C, 11), dweight0 = test::random_input<T>(s.C, 12);
    const DeviceBackward<T> d(Problem<T>(s), s);
    test::GpuEnv env(gpu::rmsnorm_backward_scratch_bytes(s.N, s.C));
    const std::vector<float> want = d.outputs(dinp0, dweight0, env.ctx)[0];
    gpu::ColumnSums sums;
    test::GpuEnv bare;
    for (gpu::ColumnSums* deferred : {static_cast<gpu::ColumnSums*>(nullptr), &sums}) {
      gpu::GpuContext ctx = bare.ctx;
      ctx.column_sums = deferred;
      DeviceBuffer<T> dinp = to_device<T>(dinp0);
      gpu::rmsnorm_backward<T>(dinp.data(), nullptr, d.dout.data(), d.inp.data(), d.weight.data(), d.rstd.data(), s.N,
                               s.C, ctx, GradWrite::kOverwrite);
      EXPECT_TRUE(test::bitwise_equal(to_host(dinp), want)) << "column sums " << (deferred != nullptr);
      EXPECT_TRUE(sums.empty());
    }
  }
}

// amax (the optional output that a linear layer's tensorwise FP8 cast reads instead of a pass of its own): the
// tensorwise maximum of out, and of dinp as accumulated, as fp8_maxima takes it of the stored values, bit for bit, and
// within kTol of the CPU reference's amax; out, rstd and dinp keep the bits of a run without it.
TYPED_TEST(RmsNormGpuTest, AmaxIsTheMaximumOfWhatItWrites) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C);
    const Problem<T> p(s);
    test::GpuEnv env;
    DeviceBuffer<T> inp = to_device<T>(p.inp), weight = to_device<T>(p.weight);
    DeviceBuffer<T> plain(s.N * s.C), out(s.N * s.C);
    DeviceBuffer<float> plain_rstd(s.N), rstd(s.N);
    gpu::rmsnorm_forward<T>(plain.data(), plain_rstd.data(), inp.data(), weight.data(), kEps, s.N, s.C, env.ctx);
    test::DeviceMaximum amax;
    gpu::rmsnorm_forward<T>(out.data(), rstd.data(), inp.data(), weight.data(), kEps, s.N, s.C, env.ctx, amax.data());
    const std::vector<float> got = to_host(out);
    EXPECT_TRUE(test::bitwise_equal(got, to_host(plain))) << "out";
    EXPECT_TRUE(test::bitwise_equal(to_host(rstd), to_host(plain_rstd))) << "rstd";
    std::vector<float> cpu_out(s.N * s.C), cpu_rstd(s.N);
    unsigned cpu = 0;
    rmsnorm_forward(cpu_out.data(), cpu_rstd.data(), p.inp.data(), p.weight.data(), kEps, s.N, s.C, &cpu);
    EXPECT_TRUE(test::maximum_matches(amax.bits(), got, cpu, kTol<T>)) << "forward";

    const std::vector<float> dinp0 = test::random_input<T>(s.N * s.C, 13);
    const DeviceBackward<T> d(p, s);
    DeviceBuffer<T> dplain = to_device<T>(dinp0), dinp = to_device<T>(dinp0);
    gpu::rmsnorm_backward<T>(dplain.data(), nullptr, d.dout.data(), d.inp.data(), d.weight.data(), d.rstd.data(), s.N,
                             s.C, env.ctx, GradWrite::kOverwrite);
    test::DeviceMaximum damax;
    gpu::rmsnorm_backward<T>(dinp.data(), nullptr, d.dout.data(), d.inp.data(), d.weight.data(), d.rstd.data(), s.N,
                             s.C, env.ctx, GradWrite::kOverwrite, damax.data());
    const std::vector<float> dgot = to_host(dinp);
    EXPECT_TRUE(test::bitwise_equal(dgot, to_host(dplain))) << "dinp";
    std::vector<float> cpu_dinp = dinp0;
    unsigned dcpu = 0;
    rmsnorm_backward(cpu_dinp.data(), nullptr, p.dout.data(), p.inp.data(), p.weight.data(), p.rstd.data(), s.N, s.C,
                     GradWrite::kOverwrite, &dcpu);
    EXPECT_TRUE(test::maximum_matches(damax.bits(), dgot, dcpu, kTol<T>)) << "backward";
  }
}

// Non-finite values count as the maxima pass counts them (gpu::fp8_maxima_async of the output: a NaN's or an
// infinity's bits above every finite value's): a NaN input makes its row NaN, an infinite weight its column infinite.
// Float and bf16, the types FP8 casts read.
template <typename T>
void expect_non_finite_maxima() {
  for (const Shape& s : {Shape{5, 64}, Shape{37, 771}, Shape{103, 4096}})
    for (const float bad : {NAN, INFINITY}) {
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " " << bad);
      Problem<T> p(s);
      if (std::isnan(bad))
        p.inp[static_cast<size_t>(s.C + 1)] = bad;  // row 1
      else
        p.weight[1] = bad;
      test::GpuEnv env;
      DeviceBuffer<T> inp = to_device<T>(p.inp), weight = to_device<T>(p.weight), out(s.N * s.C);
      DeviceBuffer<float> rstd(s.N);
      test::DeviceMaximum amax;
      gpu::rmsnorm_forward<T>(out.data(), rstd.data(), inp.data(), weight.data(), kEps, s.N, s.C, env.ctx, amax.data());
      EXPECT_TRUE(test::non_finite_bits(amax.bits())) << std::hex << amax.bits();
      EXPECT_EQ(amax.bits(), test::device_maximum(out.data(), s.N * s.C, env.ctx)) << "forward";

      const DeviceBackward<T> d(p, s);
      DeviceBuffer<T> dinp = to_device<T>(std::vector<float>(s.N * s.C, 0.0f));
      test::DeviceMaximum damax;
      gpu::rmsnorm_backward<T>(dinp.data(), nullptr, d.dout.data(), d.inp.data(), d.weight.data(), d.rstd.data(), s.N,
                               s.C, env.ctx, GradWrite::kOverwrite, damax.data());
      EXPECT_TRUE(test::non_finite_bits(damax.bits())) << std::hex << damax.bits();
      EXPECT_EQ(damax.bits(), test::device_maximum(dinp.data(), s.N * s.C, env.ctx)) << "backward";
    }
}

TEST(RmsNormGpu, AmaxTakesNonFiniteValuesAsTheMaximaPass) {
  ST_SKIP_WITHOUT_GPU();
  expect_non_finite_maxima<float>();
  expect_non_finite_maxima<bf16>();
}

// gpu::rmsnorm_forward_fp8 writes the bits of the unfused path it replaces: rmsnorm_forward<T>'s rstd, and its out cast
// with the same maximum (test::UnfusedCast) with its amax, on the 8 x 8 blocks (N and C multiples of 8: a block of
// rows part full, C past one warp's columns and not a multiple of them) and on the any-shape path (odd shapes, a
// misaligned input), either layout left out; against the CPU reference each code within one step of the CPU's (its
// sum of squares is in double). Float and bf16; both formats; a given maximum of out's own and of a quarter of it.
template <typename T>
void expect_fused_cast_as_unfused() {
  struct Case {
    Shape s;
    int offset;  // elements before the input: 1 misaligns it
  };
  for (const Case& k : {Case{{3, 7}, 0}, Case{{16, 24}, 0}, Case{{40, 64}, 0}, Case{{40, 64}, 1}, Case{{264, 136}, 0},
                        Case{{72, 1160}, 0}})
    for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
      for (float part : {1.0f, 0.25f}) {
        const Shape& s = k.s;
        SCOPED_TRACE(::testing::Message()
                     << "N=" << s.N << " C=" << s.C << " offset " << k.offset << " " << to_string(f) << " x" << part);
        const Problem<T> p(s);
        test::GpuEnv env(gpu::fp8_quantize_scratch_bytes(2));
        const int64_t n = s.N * s.C;
        std::vector<float> padded(static_cast<size_t>(k.offset), 0.0f);
        padded.insert(padded.end(), p.inp.begin(), p.inp.end());
        const DeviceBuffer<T> inp_buffer = to_device<T>(padded), weight = to_device<T>(p.weight);
        const T* inp = inp_buffer.data() + k.offset;
        DeviceBuffer<T> out(n);
        DeviceBuffer<float> rstd(s.N), fused_rstd(s.N);
        test::DeviceMaximum out_max;
        gpu::rmsnorm_forward<T>(out.data(), rstd.data(), inp, weight.data(), kEps, s.N, s.C, env.ctx, out_max.data());
        const unsigned own_bits = out_max.bits();
        float m = 0.0f;
        std::memcpy(&m, &own_bits, sizeof(m));
        const unsigned given = testing::maximum_bits(m * part);
        const DeviceBuffer<unsigned> amax = test::ints_to_device(std::vector<unsigned>{given});
        const test::UnfusedCast<T> want(out.data(), s.N, s.C, f, given, env);
        DeviceBuffer<uint8_t> q(n), q_t(n), only(n), row_only(n);
        DeviceBuffer<float> inv(1);
        test::DeviceMaximum own;
        gpu::rmsnorm_forward_fp8<T>(q.data(), q_t.data(), inv.data(), own.data(), fused_rstd.data(), inp, weight.data(),
                                    kEps, s.N, s.C, f, amax.data(), env.ctx);
        const std::vector<uint8_t> got = test::ints_to_host(q);
        EXPECT_EQ(got, want.q);
        EXPECT_EQ(test::ints_to_host(q_t), want.q_t);
        EXPECT_EQ(test::ints_to_host(inv)[0], want.inverse);
        EXPECT_EQ(own.bits(), own_bits);
        EXPECT_TRUE(test::bitwise_equal(to_host(fused_rstd), to_host(rstd)));
        gpu::rmsnorm_forward_fp8<T>(nullptr, only.data(), inv.data(), nullptr, fused_rstd.data(), inp, weight.data(),
                                    kEps, s.N, s.C, f, amax.data(), env.ctx);
        EXPECT_EQ(test::ints_to_host(only), want.q_t);
        gpu::rmsnorm_forward_fp8<T>(row_only.data(), nullptr, inv.data(), nullptr, fused_rstd.data(), inp,
                                    weight.data(), kEps, s.N, s.C, f, amax.data(), env.ctx);
        EXPECT_EQ(test::ints_to_host(row_only), want.q);
        std::vector<uint8_t> cpu(static_cast<size_t>(n));
        std::vector<float> cpu_rstd(static_cast<size_t>(s.N));
        float cpu_inv = 0;
        rmsnorm_forward_fp8(cpu.data(), nullptr, &cpu_inv, nullptr, cpu_rstd.data(), p.inp.data(), p.weight.data(),
                            kEps, s.N, s.C, f, &given);
        EXPECT_EQ(cpu_inv, want.inverse);
        EXPECT_EQ(test::codes_over_a_step_apart(cpu, got, 0), 0);
      }
}

TEST(RmsNormGpu, Fp8CastsAsTheUnfusedPathDoes) {
  ST_SKIP_WITHOUT_GPU();
  expect_fused_cast_as_unfused<float>();
  expect_fused_cast_as_unfused<bf16>();
}

TYPED_TEST(RmsNormGpuTest, BackwardRejectsTooLittleScratch) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const Shape s{300, 96};
  const Problem<T> p(s);
  const DeviceBackward<T> d(p, s);
  DeviceBuffer<T> dinp = to_device<T>(p.dout), dweight = to_device<T>(p.weight);
  test::GpuEnv env(gpu::rmsnorm_backward_scratch_bytes(s.N, s.C) - 1);
  EXPECT_THROW(d.run(dinp, dweight, env.ctx), Error);
}

}  // namespace
}  // namespace st
