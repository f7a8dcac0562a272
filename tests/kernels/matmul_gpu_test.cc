// st::gpu matmul (cuBLASLt) against the CPU reference st::matmul_*, for T = float (1e-5), bf16 and fp16 (1e-2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "../../src/kernels/gemv.cuh"
#include "gpu_kernel_test.h"
#include "shardtrain/kernels/gelu.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/kernels/gpu/rmsnorm.h"
#include "shardtrain/kernels/gpu/swiglu.h"
#include "shardtrain/kernels/matmul.h"
#include "shardtrain/kernels/rmsnorm.h"
#include "shardtrain/kernels/swiglu.h"

namespace st {
namespace {

using test::close;
using test::kTol;
using test::poison;
using test::random_input;
using test::to_device;
using test::to_host;

// dw after dweight (+)= dout^T inp from dw0 [OC, C] (N terms an element), against the CPU's want, element by element
// within rtol of |dw0| + |the product| (or of 1e-3 of the largest |want|), plus fp32 accumulation's error over the
// terms' magnitudes, 4 N 2^-24 sum |dout| |inp|. cuBLASLt may round the product to T before it adds dw0 (an H200 does
// at 3 x 136 x 9,000 in bf16): where the two nearly cancel, the error is the product's rounding, not the sum's; and a
// product of many terms may cancel far below them.
::testing::AssertionResult close_accumulated(const std::vector<float>& got, const std::vector<float>& want,
                                             const std::vector<float>& dw0, const std::vector<float>& dout,
                                             const std::vector<float>& inp, int64_t N, int C, int OC, double rtol) {
  double amax = 0;
  for (float w : want) amax = std::max(amax, std::fabs(static_cast<double>(w)));
  const double accumulation = 4.0 * static_cast<double>(N) * std::ldexp(1.0, -24);
  for (int o = 0; o < OC; ++o)
    for (int c = 0; c < C; ++c) {
      const size_t i = static_cast<size_t>(o) * C + c;
      double terms = 0;
      for (int64_t n = 0; n < N; ++n) terms += std::fabs(static_cast<double>(dout[n * OC + o]) * inp[n * C + c]);
      const double start = std::fabs(static_cast<double>(dw0[i]));
      const double product = std::fabs(static_cast<double>(want[i]) - dw0[i]);
      const double bound = rtol * std::max(start + product, 1e-3 * amax) + accumulation * terms;
      if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= bound))
        return ::testing::AssertionFailure()
               << "element " << i << ": got " << got[i] << ", want " << want[i] << " (bound " << bound << ")";
    }
  return ::testing::AssertionSuccess();
}

// Odd sizes in every dimension (no 16-byte rows), N = 1, and N > 128 so the bias sum spans several chunks; N of 2
// and 4 with 16-byte rows, for the forward's GEMV of a decoding step's few rows, and 9,000 output columns, more than
// the GEMV's grid has warps below 281 multiprocessors (each warp takes several columns in turn).
struct Shape {
  int64_t N;
  int C, OC;
};
const Shape kShapes[] = {{1, 7, 13},     {5, 13, 7},   {37, 64, 48}, {130, 24, 72},
                         {300, 96, 200}, {2, 256, 96}, {4, 520, 72}, {3, 136, 9000}};

// Stream 0: the test helpers' cudaMemcpy/cudaMemset run there too, so everything is ordered.
struct Env {
  gpu::Blas blas;
  DeviceBuffer<char> scratch;
  explicit Env(size_t scratch_bytes = 0) : scratch(static_cast<int64_t>(std::max<size_t>(scratch_bytes, 1))) {
    poison(scratch);  // kernels must not depend on what scratch held
  }
  gpu::GpuContext ctx() { return {nullptr, &blas, scratch.data(), static_cast<size_t>(scratch.size())}; }
};

// Random operands of one shape, already rounded to T so the CPU reference sees the GPU's values.
template <typename T>
struct Operands {
  Shape s;
  std::vector<float> inp, w, b, dout;
  Operands(const Shape& shape, uint64_t stream) : s(shape) {
    inp = random_input<T>(s.N * s.C, stream);
    w = random_input<T>(static_cast<int64_t>(s.OC) * s.C, stream + 1, 0.3f);
    b = random_input<T>(s.OC, stream + 2);
    dout = random_input<T>(s.N * s.OC, stream + 3);
  }
};

template <typename T>
class MatmulGpu : public ::testing::Test {};
TYPED_TEST_SUITE(MatmulGpu, test::ActivationTypes, test::ActivationNames);

TYPED_TEST(MatmulGpu, ForwardMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  Env env;
  for (const Shape& s : kShapes) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " bias=" << with_bias);
      Operands<T> k(s, 100);
      std::vector<float> want(s.N * s.OC);
      matmul_forward(want.data(), k.inp.data(), k.w.data(), with_bias ? k.b.data() : nullptr, s.N, s.C, s.OC);

      auto inp = to_device<T>(k.inp), w = to_device<T>(k.w), b = to_device<T>(k.b);
      DeviceBuffer<T> out(s.N * s.OC);
      poison(out);
      gpu::matmul_forward<T>(out.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, s.N, s.C, s.OC,
                             env.ctx());
      EXPECT_TRUE(close(to_host(out), want, kTol<T>));
    }
  }
}

TYPED_TEST(MatmulGpu, ForwardGeluMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  Env env;
  for (const Shape& s : kShapes) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " bias=" << with_bias);
      Operands<T> k(s, 200);
      std::vector<float> want_pre(s.N * s.OC), want_out(s.N * s.OC);
      matmul_forward(want_pre.data(), k.inp.data(), k.w.data(), with_bias ? k.b.data() : nullptr, s.N, s.C, s.OC);
      gelu_forward(want_out.data(), want_pre.data(), s.N * s.OC);

      auto inp = to_device<T>(k.inp), w = to_device<T>(k.w), b = to_device<T>(k.b);
      DeviceBuffer<T> out(s.N * s.OC), pre(s.N * s.OC);
      poison(out);
      poison(pre);
      gpu::matmul_forward_gelu<T>(out.data(), pre.data(), inp.data(), w.data(), with_bias ? b.data() : nullptr, s.N,
                                  s.C, s.OC, env.ctx());
      EXPECT_TRUE(close(to_host(pre), want_pre, kTol<T>));
      EXPECT_TRUE(close(to_host(out), want_out, kTol<T>));
    }
  }
}

// The projection into a residual: fused (beta = 1 reading the residual, bias epilogue) where cuBLASLt has an
// algorithm; offset-by-one operands take the unfused path. Separate output (poisoned) and in place. In bf16/fp16
// the unfused path rounds twice (residual + bias, then + product), and so may cuBLASLt in place (it is free to
// split K and accumulate into the output), hence twice the tolerance there.
TYPED_TEST(MatmulGpu, ForwardResidualMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  Env env;
  for (const Shape& s : kShapes) {
    for (int offset : {0, 1}) {
      for (bool with_bias : {true, false}) {
        for (bool in_place : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " offset=" << offset
                                            << " bias=" << with_bias << " in_place=" << in_place);
          Operands<T> k(s, 250);
          const std::vector<float> res = random_input<T>(s.N * s.OC, 255);
          std::vector<float> want(s.N * s.OC);
          matmul_forward_residual(want.data(), k.inp.data(), k.w.data(), with_bias ? k.b.data() : nullptr, res.data(),
                                  s.N, s.C, s.OC);

          auto inp = test::upload<T>(k.inp, offset), w = test::upload<T>(k.w, offset);
          auto b = test::upload<T>(k.b, offset), r = test::upload<T>(res, offset);
          DeviceBuffer<T> sep(s.N * s.OC + offset);
          poison(sep);
          T* out = in_place ? r.data() + offset : sep.data() + offset;
          gpu::matmul_forward_residual<T>(out, inp.data() + offset, w.data() + offset,
                                          with_bias ? b.data() + offset : nullptr, r.data() + offset, s.N, s.C, s.OC,
                                          env.ctx());
          EXPECT_TRUE(
              close(test::download(in_place ? r : sep, offset), want, (offset == 0 && !in_place ? 1 : 2) * kTol<T>));
        }
      }
    }
  }
}

// The RMSNorm and the product: up to 4 rows one GEMV that normalises as it reads (rows longer than one pass of its
// loads, rows of no 16-byte packs, and more columns than the GEMV has warps), more rows the two kernels; against the
// CPU, and the GEMV bit for bit against rmsnorm_forward followed by matmul_forward (the same rounding of the
// normalised rows, the same sums).
TYPED_TEST(MatmulGpu, RmsnormForwardMatchesCpuAndTheTwoKernels) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  Env env;
  const float eps = 1e-5f;
  for (const Shape& s : {Shape{1, 7, 13}, Shape{3, 4104, 40}, Shape{4, 2048, 72}, Shape{2, 520, 9}, Shape{9, 96, 40},
                         Shape{2, 264, 9000}}) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " bias=" << with_bias);
      Operands<T> k(s, 400);
      const std::vector<float> g = test::random_input<T>(s.C, 404);
      // Both GPU paths round the normalised rows to T before the product (they are the block's activations): the
      // reference takes the CPU's rows rounded so, not its fp32 ones, whose difference alone exceeds kTol<bf16> on
      // products of 4,104 terms.
      std::vector<float> want(s.N * s.OC), norm(s.N * s.C), rstd(s.N);
      rmsnorm_forward(norm.data(), rstd.data(), k.inp.data(), g.data(), eps, s.N, s.C);
      norm = test::round_through<T>(std::move(norm));
      matmul_forward(want.data(), norm.data(), k.w.data(), with_bias ? k.b.data() : nullptr, s.N, s.C, s.OC);
      auto inp = to_device<T>(k.inp), w = to_device<T>(k.w), b = to_device<T>(k.b), dg = to_device<T>(g);
      DeviceBuffer<T> out(s.N * s.OC), dnorm(s.N * s.C);
      DeviceBuffer<float> drstd(s.N);
      poison(out);
      const T* bias = with_bias ? b.data() : nullptr;
      gpu::rmsnorm_matmul_forward<T>(out.data(), dnorm.data(), drstd.data(), inp.data(), dg.data(), eps, w.data(), bias,
                                     s.N, s.C, s.OC, env.ctx());
      const std::vector<float> got = to_host(out);
      EXPECT_TRUE(close(got, want, kTol<T>));
      DeviceBuffer<T> two(s.N * s.OC);
      gpu::rmsnorm_forward<T>(dnorm.data(), drstd.data(), inp.data(), dg.data(), eps, s.N, s.C, env.ctx());
      gpu::matmul_forward<T>(two.data(), dnorm.data(), w.data(), bias, s.N, s.C, s.OC, env.ctx());
      if (s.N <= 4) EXPECT_TRUE(test::bitwise_equal(got, to_host(two)));
    }
  }
}

// The SwiGLU and the down projection: up to 4 rows whose SwiGLU fits a block's shared memory one GEMV that stages it
// (rows of 16-byte packs and not), the rest (more rows, or 4 rows of 8,192 in 16 bits) the two kernels; against the
// CPU, and every shape bit for bit against swiglu_forward followed by matmul_forward_residual.
TYPED_TEST(MatmulGpu, SwigluForwardResidualMatchesCpuAndTheTwoKernels) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  Env env;
  for (const Shape& s : {Shape{1, 8, 40}, Shape{2, 2048, 72}, Shape{3, 13, 9}, Shape{4, 8192, 40}, Shape{9, 96, 40},
                         Shape{1, 264, 9000}}) {
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " F=" << s.C << " OC=" << s.OC << " bias=" << with_bias);
      const std::vector<float> gate_up = random_input<T>(2 * s.N * s.C, 600, 2.0f);
      const std::vector<float> w = random_input<T>(int64_t{s.OC} * s.C, 601, 0.3f), b = random_input<T>(s.OC, 602);
      const std::vector<float> res = random_input<T>(s.N * s.OC, 603);
      // The CPU reference (swiglu_matmul_forward_residual's two steps), with the SwiGLU rounded to T between them as
      // both GPU paths store it.
      std::vector<float> want(s.N * s.OC), mlp(s.N * s.C);
      swiglu_forward(mlp.data(), gate_up.data(), s.N, s.C);
      mlp = test::round_through<T>(std::move(mlp));
      matmul_forward_residual(want.data(), mlp.data(), w.data(), with_bias ? b.data() : nullptr, res.data(), s.N, s.C,
                              s.OC);
      auto dgu = to_device<T>(gate_up), dw = to_device<T>(w), db = to_device<T>(b), dres = to_device<T>(res);
      DeviceBuffer<T> dmlp(s.N * s.C), two_mlp(s.N * s.C);
      const T* bias = with_bias ? db.data() : nullptr;
      // The two kernels in place on the residual too: cuBLASLt may take another algorithm where out is not the
      // residual (more than 4 rows), which gives other bits.
      DeviceBuffer<T> two = to_device<T>(res);
      gpu::swiglu_forward<T>(two_mlp.data(), dgu.data(), s.N, s.C, env.ctx());
      gpu::matmul_forward_residual<T>(two.data(), two_mlp.data(), dw.data(), bias, two.data(), s.N, s.C, s.OC,
                                      env.ctx());
      // In place on the residual, as the decoder runs it.
      gpu::swiglu_matmul_forward_residual<T>(dres.data(), dmlp.data(), dgu.data(), dw.data(), bias, dres.data(), s.N,
                                             s.C, s.OC, env.ctx());
      const std::vector<float> got = to_host(dres);
      EXPECT_TRUE(close(got, want, 2 * kTol<T>));
      EXPECT_TRUE(test::bitwise_equal(got, to_host(two)));
      // The weights through the shared-memory ring, after the staged SwiGLU rows: the same bits.
      for (int depth : {4, 8}) {
        DeviceBuffer<T> ring_out = to_device<T>(res);
        if (gpu::kernels_internal::gemv_swiglu<T>(ring_out.data(), dgu.data(), dw.data(), bias, ring_out.data(), s.N,
                                                  s.C, s.OC, env.ctx(), {0, depth, true, true}))
          EXPECT_TRUE(test::bitwise_equal(to_host(ring_out), got)) << "ring, depth " << depth;
      }
    }
  }
}

// Every way the GEMV of at most 4 rows can run (kernels_internal::GemvLaunch: its rows staged in shared memory or
// read where they are, 4 or 8 weight packs in flight a lane, in registers or through a shared-memory ring, a warp for
// each column or grids of 1 to 8 blocks a multiprocessor whose warps take several) sums each column in the same order:
// the defaults' bits, which the tests above hold against the CPU, with the norm folded in and with a residual and bias,
// packed and unpacked rows.
TYPED_TEST(MatmulGpu, EveryGemvLaunchGivesTheSameBits) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  Env env;
  for (const Shape& s : {Shape{1, 264, 9000}, Shape{4, 520, 72}, Shape{3, 7, 13}, Shape{2, 2048, 600}}) {
    for (bool norm : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " norm=" << norm);
      Operands<T> k(s, 500);
      const std::vector<float> g = random_input<T>(s.C, 504), res = random_input<T>(s.N * s.OC, 505);
      auto inp = to_device<T>(k.inp), w = to_device<T>(k.w), b = to_device<T>(k.b), dg = to_device<T>(g);
      auto r = to_device<T>(res);
      DeviceBuffer<T> out(s.N * s.OC);
      auto run = [&](const gpu::kernels_internal::GemvLaunch& how) {
        poison(out);
        gpu::kernels_internal::gemv<T>(out.data(), inp.data(), norm ? dg.data() : nullptr, 1e-5f, w.data(), b.data(),
                                       norm ? nullptr : r.data(), s.N, s.C, s.OC, env.ctx(), how);
        return to_host(out);
      };
      const std::vector<float> want = run({});
      for (bool ring : {false, true})
        for (bool staged : {false, true})
          for (int depth : {4, 8})
            for (int cap : {0, 1, 2, 8}) {
              SCOPED_TRACE(::testing::Message()
                           << "ring=" << ring << " staged=" << staged << " depth=" << depth << " cap=" << cap);
              EXPECT_TRUE(test::bitwise_equal(run({cap, depth, staged, ring}), want));
            }
    }
  }
}

// Operands one element past an allocation: 4- or 2-byte aligned only, which rules out the vectorised
// cuBLASLt kernels (and, possibly, the fused bias).
TYPED_TEST(MatmulGpu, ForwardUnalignedOperands) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  Env env;
  const Shape s{33, 40, 24};
  Operands<T> k(s, 300);
  std::vector<float> want(s.N * s.OC);
  matmul_forward(want.data(), k.inp.data(), k.w.data(), k.b.data(), s.N, s.C, s.OC);

  auto inp = test::upload<T>(k.inp, 1), w = test::upload<T>(k.w, 1), b = test::upload<T>(k.b, 1);
  DeviceBuffer<T> out(s.N * s.OC + 1);
  poison(out);
  gpu::matmul_forward<T>(out.data() + 1, inp.data() + 1, w.data() + 1, b.data() + 1, s.N, s.C, s.OC, env.ctx());
  const std::vector<float> got = test::download(out, 1);
  EXPECT_TRUE(close(got, want, kTol<T>));
}

TYPED_TEST(MatmulGpu, BackwardAccumulatesLikeCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    for (bool full : {true, false}) {  // full: dinp and dbias too; else dweight only (both null)
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " full=" << full);
      Operands<T> k(s, 400);
      // Both sides start from the same non-zero gradients: the kernels must add to them.
      const std::vector<float> dinp0 = random_input<T>(s.N * s.C, 410);
      const std::vector<float> dw0 = random_input<T>(static_cast<int64_t>(s.OC) * s.C, 411);
      const std::vector<float> db0 = random_input<T>(s.OC, 412);
      std::vector<float> want_dinp = dinp0, want_dw = dw0, want_db = db0;
      matmul_backward(full ? want_dinp.data() : nullptr, want_dw.data(), full ? want_db.data() : nullptr, k.dout.data(),
                      k.inp.data(), k.w.data(), s.N, s.C, s.OC);

      Env env(gpu::matmul_backward_scratch_bytes(s.N, s.OC));
      auto dout = to_device<T>(k.dout), inp = to_device<T>(k.inp), w = to_device<T>(k.w);
      auto dinp = to_device<T>(dinp0), dw = to_device<T>(dw0), db = to_device<T>(db0);
      gpu::matmul_backward<T>(full ? dinp.data() : nullptr, dw.data(), full ? db.data() : nullptr, dout.data(),
                              inp.data(), w.data(), s.N, s.C, s.OC, env.ctx());
      EXPECT_TRUE(close_accumulated(to_host(dw), want_dw, dw0, k.dout, k.inp, s.N, s.C, s.OC, kTol<T>));
      EXPECT_TRUE(close(to_host(dinp), want_dinp, kTol<T>));  // untouched (= dinp0) when not full
      EXPECT_TRUE(close(to_host(db), want_db, kTol<T>));
    }
  }
}

// kOverwrite: dinp = dout @ weight into a poisoned buffer; dweight and dbias still accumulate.
TYPED_TEST(MatmulGpu, BackwardOverwritesDinpOnRequest) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC);
    Operands<T> k(s, 450);
    const std::vector<float> dw0 = random_input<T>(static_cast<int64_t>(s.OC) * s.C, 451);
    const std::vector<float> db0 = random_input<T>(s.OC, 452);
    std::vector<float> want_dinp(s.N * s.C, 0.0f), want_dw = dw0, want_db = db0;
    matmul_backward(want_dinp.data(), want_dw.data(), want_db.data(), k.dout.data(), k.inp.data(), k.w.data(), s.N, s.C,
                    s.OC);

    Env env(gpu::matmul_backward_scratch_bytes(s.N, s.OC));
    auto dout = to_device<T>(k.dout), inp = to_device<T>(k.inp), w = to_device<T>(k.w);
    auto dw = to_device<T>(dw0), db = to_device<T>(db0);
    DeviceBuffer<T> dinp(s.N * s.C);
    poison(dinp);
    gpu::matmul_backward<T>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), s.N, s.C, s.OC,
                            env.ctx(), GradWrite::kOverwrite);
    EXPECT_TRUE(close(to_host(dinp), want_dinp, kTol<T>));
    EXPECT_TRUE(close_accumulated(to_host(dw), want_dw, dw0, k.dout, k.inp, s.N, s.C, s.OC, kTol<T>));
    EXPECT_TRUE(close(to_host(db), want_db, kTol<T>));
  }
}

// param_write = kOverwrite: dweight and dbias poisoned first, written as the CPU reference writes them; through
// matmul_backward and matmul_backward_gelu (its fused DGELU path where cuBLASLt has one).
TYPED_TEST(MatmulGpu, BackwardOverwritesParamsOnRequest) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    for (bool gelu : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " gelu=" << gelu);
      Operands<T> k(s, 470);
      const std::vector<float> pre = random_input<T>(s.N * s.C, 471, 2.0f);
      std::vector<float> act(pre.size());
      gelu_forward(act.data(), pre.data(), s.N * s.C);
      const std::vector<float> inp_t = gelu ? to_host(to_device<T>(act)) : k.inp;
      std::vector<float> want_dinp(s.N * s.C, 0.0f), want_dw(static_cast<size_t>(s.OC) * s.C, 0.0f),
          want_db(s.OC, 0.0f);
      if (gelu)
        matmul_backward_gelu(want_dinp.data(), want_dw.data(), want_db.data(), k.dout.data(), inp_t.data(), k.w.data(),
                             pre.data(), s.N, s.C, s.OC);
      else
        matmul_backward(want_dinp.data(), want_dw.data(), want_db.data(), k.dout.data(), inp_t.data(), k.w.data(), s.N,
                        s.C, s.OC, GradWrite::kOverwrite);

      Env env(gpu::matmul_backward_scratch_bytes(s.N, s.OC));
      auto dout = to_device<T>(k.dout), inp = to_device<T>(inp_t), w = to_device<T>(k.w), p = to_device<T>(pre);
      DeviceBuffer<T> dinp(s.N * s.C), dw(static_cast<int64_t>(s.OC) * s.C), db(s.OC);
      poison(dinp);
      poison(dw);
      poison(db);
      if (gelu)
        gpu::matmul_backward_gelu<T>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), p.data(),
                                     s.N, s.C, s.OC, env.ctx(), GradWrite::kOverwrite);
      else
        gpu::matmul_backward<T>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), s.N, s.C, s.OC,
                                env.ctx(), GradWrite::kOverwrite, GradWrite::kOverwrite);
      EXPECT_TRUE(close(to_host(dinp), want_dinp, kTol<T>));
      EXPECT_TRUE(close(to_host(dw), want_dw, kTol<T>));
      EXPECT_TRUE(close(to_host(db), want_db, kTol<T>));
    }
  }
}

// A frozen weight (dweight null): no weight gradient, and dinp and dbias get the same bits as with it, through
// matmul_backward and matmul_backward_gelu.
TYPED_TEST(MatmulGpu, BackwardWithoutDweightGivesTheSameRest) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    for (bool gelu : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC << " gelu=" << gelu);
      Operands<T> k(s, 480);
      const std::vector<float> pre = random_input<T>(s.N * s.C, 481, 2.0f);
      Env env(gpu::matmul_backward_scratch_bytes(s.N, s.OC));
      auto dout = to_device<T>(k.dout), inp = to_device<T>(k.inp), w = to_device<T>(k.w), p = to_device<T>(pre);
      auto run = [&](T* dweight, std::vector<float>* dinp_out, std::vector<float>* dbias_out) {
        DeviceBuffer<T> dinp(s.N * s.C), dbias(s.OC);
        poison(dinp);
        poison(dbias);
        if (gelu)
          gpu::matmul_backward_gelu<T>(dinp.data(), dweight, dbias.data(), dout.data(), inp.data(), w.data(), p.data(),
                                       s.N, s.C, s.OC, env.ctx(), GradWrite::kOverwrite);
        else
          gpu::matmul_backward<T>(dinp.data(), dweight, dbias.data(), dout.data(), inp.data(), w.data(), s.N, s.C, s.OC,
                                  env.ctx(), GradWrite::kOverwrite, GradWrite::kOverwrite);
        *dinp_out = to_host(dinp);
        *dbias_out = to_host(dbias);
      };
      DeviceBuffer<T> dw(static_cast<int64_t>(s.OC) * s.C);
      std::vector<float> want_dinp, want_dbias, dinp, dbias;
      run(dw.data(), &want_dinp, &want_dbias);
      run(nullptr, &dinp, &dbias);
      EXPECT_TRUE(test::bitwise_equal(dinp, want_dinp)) << "dinp";
      EXPECT_TRUE(test::bitwise_equal(dbias, want_dbias)) << "dbias";
    }
  }
}

// matmul_backward_gelu against the CPU reference: the DGELU epilogue where cuBLASLt has it (C % 8 == 0), the
// GEMM plus the GELU kernel otherwise; dinp is overwritten (poisoned first), dweight and dbias accumulate.
TYPED_TEST(MatmulGpu, BackwardGeluMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "N=" << s.N << " C=" << s.C << " OC=" << s.OC);
    Operands<T> k(s, 460);
    const std::vector<float> pre = random_input<T>(s.N * s.C, 461, 2.0f);
    std::vector<float> act(pre.size());
    gelu_forward(act.data(), pre.data(), s.N * s.C);
    const std::vector<float> act_t = to_host(to_device<T>(act));  // the activations as T holds them
    const std::vector<float> dw0 = random_input<T>(static_cast<int64_t>(s.OC) * s.C, 462);
    const std::vector<float> db0 = random_input<T>(s.OC, 463);
    std::vector<float> want_dinp(s.N * s.C), want_dw = dw0, want_db = db0;
    matmul_backward_gelu(want_dinp.data(), want_dw.data(), want_db.data(), k.dout.data(), act_t.data(), k.w.data(),
                         pre.data(), s.N, s.C, s.OC);

    Env env(gpu::matmul_backward_scratch_bytes(s.N, s.OC));
    auto dout = to_device<T>(k.dout), inp = to_device<T>(act), w = to_device<T>(k.w), p = to_device<T>(pre);
    auto dw = to_device<T>(dw0), db = to_device<T>(db0);
    DeviceBuffer<T> dinp(s.N * s.C);
    poison(dinp);
    gpu::matmul_backward_gelu<T>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), p.data(), s.N,
                                 s.C, s.OC, env.ctx());
    EXPECT_TRUE(close(to_host(dinp), want_dinp, kTol<T>));
    EXPECT_TRUE(close_accumulated(to_host(dw), want_dw, dw0, k.dout, act_t, s.N, s.C, s.OC, kTol<T>));
    EXPECT_TRUE(close(to_host(db), want_db, kTol<T>));
  }
}

// Same inputs, same bits: the bias sum has a fixed order, added to or written (OC = 200 takes the packed loads,
// OC = 201 the scalar ones), and it is right: dout's column sums, on db0 or in its place. Also, the second run
// reuses every cuBLASLt plan.
TYPED_TEST(MatmulGpu, BackwardBiasIsBitReproducible) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : {Shape{4099, 64, 200}, Shape{4099, 64, 201}}) {
    for (GradWrite write : {GradWrite::kAccumulate, GradWrite::kOverwrite}) {
      SCOPED_TRACE(::testing::Message() << "OC=" << s.OC << " write=" << static_cast<int>(write));
      Operands<T> k(s, 500);
      const std::vector<float> db0 = random_input<T>(s.OC, 510);
      Env env(gpu::matmul_backward_scratch_bytes(s.N, s.OC));
      auto dout = to_device<T>(k.dout), inp = to_device<T>(k.inp), w = to_device<T>(k.w);
      DeviceBuffer<T> dinp(s.N * s.C), dw(static_cast<int64_t>(s.OC) * s.C);

      std::vector<std::vector<float>> runs;
      size_t plans = 0;
      for (int run = 0; run < 2; ++run) {
        auto db = to_device<T>(db0);
        gpu::matmul_backward<T>(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), s.N, s.C, s.OC,
                                env.ctx(), GradWrite::kOverwrite, write);
        runs.push_back(to_host(db));
        if (run == 0) plans = env.blas.plan_count();
      }
      EXPECT_EQ(env.blas.plan_count(), plans);
      EXPECT_TRUE(test::bitwise_equal(runs[0], runs[1]));
      std::vector<float> want(db0.size());
      for (int o = 0; o < s.OC; ++o) {
        double sum = write == GradWrite::kAccumulate ? db0[static_cast<size_t>(o)] : 0.0;
        for (int64_t r = 0; r < s.N; ++r) sum += k.dout[static_cast<size_t>(r * s.OC + o)];
        want[static_cast<size_t>(o)] = static_cast<float>(sum);
      }
      EXPECT_TRUE(close(runs[0], want, kTol<T>));
    }
  }
}

// The packed bias sums (OC % 8 == 0) add each column's rows in the scalar kernel's order: the same dout columns,
// once 200 wide (packed) and once with a 201st column appended (scalar), give the same bits for the first 200.
TYPED_TEST(MatmulGpu, BackwardBiasPackedAndScalarSumsAgreeBitForBit) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  constexpr int64_t N = 4099;
  constexpr int C = 16, OC = 200;
  const std::vector<float> dout = random_input<T>(N * OC, 530), extra = random_input<T>(N, 531);
  std::vector<float> dout_wide;
  for (int64_t r = 0; r < N; ++r) {
    dout_wide.insert(dout_wide.end(), dout.begin() + r * OC, dout.begin() + (r + 1) * OC);
    dout_wide.push_back(extra[static_cast<size_t>(r)]);
  }
  const std::vector<float> inp = random_input<T>(N * C, 532);
  Env env(gpu::matmul_backward_scratch_bytes(N, OC + 1));
  auto x = to_device<T>(inp), d = to_device<T>(dout), dw_ = to_device<T>(dout_wide);
  DeviceBuffer<T> dw(static_cast<int64_t>(OC + 1) * C), db(OC), db_wide(OC + 1);
  gpu::matmul_backward<T>(nullptr, dw.data(), db.data(), d.data(), x.data(), nullptr, N, C, OC, env.ctx(),
                          GradWrite::kOverwrite, GradWrite::kOverwrite);
  gpu::matmul_backward<T>(nullptr, dw.data(), db_wide.data(), dw_.data(), x.data(), nullptr, N, C, OC + 1, env.ctx(),
                          GradWrite::kOverwrite, GradWrite::kOverwrite);
  std::vector<float> packed = to_host(db), scalar = to_host(db_wide);
  scalar.pop_back();
  EXPECT_TRUE(test::bitwise_equal(packed, scalar));
}

// Blas::gemm's row-major convention, every transpose combination, batched, with alpha and beta, against
// the definition in double.
TYPED_TEST(MatmulGpu, StridedBatchedGemmMatchesDefinition) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  Env env;
  const int m = 5, n = 7, k = 3, batch = 3;
  const float alpha = 0.75f, beta = -1.5f;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "trans_a=" << ta << " trans_b=" << tb);
      // Padded rows (ld > row length) and padded batch strides, to pin down what ld and stride mean.
      const int64_t lda = (ta ? m : k) + 2, ldb = (tb ? k : n) + 1, ldc = n + 3;
      const int64_t sa = lda * (ta ? k : m) + 5, sb = ldb * (tb ? n : k) + 1, sc = ldc * m + 2;
      const std::vector<float> a = random_input<T>(sa * batch, 600);
      const std::vector<float> b = random_input<T>(sb * batch, 601);
      const std::vector<float> c0 = random_input<T>(sc * batch, 602);
      std::vector<float> want = c0;
      for (int i = 0; i < batch; ++i)
        for (int r = 0; r < m; ++r)
          for (int col = 0; col < n; ++col) {
            double acc = 0;
            for (int x = 0; x < k; ++x) {
              const double av = a[i * sa + (ta ? x * lda + r : r * lda + x)];
              const double bv = b[i * sb + (tb ? col * ldb + x : x * ldb + col)];
              acc += av * bv;
            }
            float& cv = want[i * sc + r * ldc + col];
            cv = static_cast<float>(alpha * acc + beta * cv);
          }
      auto da = to_device<T>(a), db = to_device<T>(b), dc = to_device<T>(c0);
      env.blas.gemm<T>(ta, tb, m, n, k, alpha, da.data(), lda, sa, db.data(), ldb, sb, beta, dc.data(), ldc, sc, batch,
                       nullptr);
      EXPECT_TRUE(close(to_host(dc), want, kTol<T>));  // padding: c0 on both sides
    }
  }
}

// Tuning times cuBLASLt's candidates and keeps one of them: the result still matches the CPU reference. The
// algorithms it lists replay in a new Blas bit for bit, and are checked before use.
TYPED_TEST(MatmulGpu, TunedAlgorithmsMatchCpuAndReplayExactly) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const Shape s{512, 256, 384};
  Operands<T> k(s, 700);
  std::vector<float> want(s.N * s.OC);
  matmul_forward(want.data(), k.inp.data(), k.w.data(), k.b.data(), s.N, s.C, s.OC);
  auto inp = to_device<T>(k.inp), w = to_device<T>(k.w), b = to_device<T>(k.b);
  auto run = [&](Env& env) {
    DeviceBuffer<T> out(s.N * s.OC);
    poison(out);
    gpu::matmul_forward<T>(out.data(), inp.data(), w.data(), b.data(), s.N, s.C, s.OC, env.ctx());
    return to_host(out);
  };

  Env tuned;
  tuned.blas.set_tuning(8);
  const std::vector<float> got = run(tuned);
  EXPECT_TRUE(close(got, want, kTol<T>));
  EXPECT_EQ(tuned.blas.tuning_stats().plans, 1);
  EXPECT_LE(tuned.blas.tuning_stats().chosen_ms, tuned.blas.tuning_stats().first_ms);
  const std::string listed = tuned.blas.algorithms();
  EXPECT_EQ(std::count(listed.begin(), listed.end(), '\n'), 1) << listed;

  Env replay;
  replay.blas.use_algorithms(listed);
  EXPECT_EQ(run(replay), got);  // bit for bit
  EXPECT_EQ(replay.blas.algorithms(), listed);
  EXPECT_EQ(replay.blas.tuning_stats().plans, 0);

  // A process that does not time asks `agree` and takes its answer (here the heuristic's second).
  Env follower;
  int asked = 0;
  follower.blas.set_tuning(8, false, [&](int pick) {
    EXPECT_EQ(pick, 0);
    ++asked;
    return 1;
  });
  EXPECT_TRUE(close(run(follower), want, kTol<T>));
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(follower.blas.tuning_stats().plans, 0);

  Env bad;
  try {
    bad.blas.use_algorithms("gemm 1 2 3");
    ADD_FAILURE() << "a short line was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GEMM algorithm list, line 1"), std::string::npos) << e.what();
  }
  // The same key with an algorithm cuBLASLt rejects: the GEMM names itself instead of running something else.
  std::string corrupt = listed.substr(0, listed.rfind(' ', listed.size() - 1));
  for (int word = 0; word < 7; ++word) corrupt = corrupt.substr(0, corrupt.rfind(' '));
  corrupt += " ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff ffffffff\n";
  bad.blas.use_algorithms(corrupt);
  try {
    run(bad);
    ADD_FAILURE() << "a corrupt algorithm ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is not valid here"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace st
