// st::gpu::cudnn_attention_* against the CPU reference st::attention_* (out, dqkv), a double-precision
// logsumexp (lse), and flash_attention_* on the same inputs, for bf16 and fp16; both backward modes; that the
// backward overwrites dqkv (never reads it); that the deterministic backward reruns bit for bit; the scratch
// and type checks. Shapes: hs 64 at T = 64 (one 64-row tile), at GPT-2's C = 768 with 12 heads, and at odd
// T = 100 (T % 128 != 0: cuDNN < 9.15.1 runs the padding-mask variant of the backward graph); hs 128 at T = 200.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "attention_gpu_test.h"
#include "gpu_kernel_test.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/cudnn_attention.h"
#include "shardtrain/kernels/gpu/flash_attention.h"

namespace st {
namespace {

using gpu::CudnnBackwardMode;
using test::all_close;
using test::bitwise_equal;
using test::matches;
using test::part;
using test::poison;
using test::to_device;
using test::to_host;

// out and dqkv: max |got - want| <= kTol * max |want|, as flash_attention_gpu_test.cc: the products consume P
// and dS rounded to T (bf16 2^-9, fp16 2^-12 relative), whose error scales with the terms, not the result.
constexpr double kTol = 2e-2;
// lse: |got - want| <= kLseTol * max(|want|, 1). The scores are exact products of T operands summed in fp32,
// so lse is fp32-accurate up to exp/log ulps; 1 is the scale of the score terms for unit normals.
constexpr double kLseTol = 1e-4;

using Shape = test::AttentionShape;

const Shape kShapes[] = {{2, 64, 128, 2}, {1, 256, 768, 12}, {3, 100, 256, 4}, {2, 200, 256, 2}};

// Inputs and CPU results; the CPU backward starts from dqkv = 0, which is what an overwriting backward must
// produce.
template <typename T>
struct Problem : test::AttentionProblem<T> {
  explicit Problem(const Shape& s) : test::AttentionProblem<T>(s, 1200, test::InitialGrad::kZero) {}
};

struct GpuRun {
  std::vector<float> out, lse, dqkv;
};

// cuDNN forward, then backward on the forward's out and lse, with out, lse and scratch poisoned (NaN) and
// dqkv filled with the byte `dqkv_fill` (0xFF: NaN) before the backward, which must overwrite it.
template <typename T>
GpuRun run_cudnn(gpu::Cudnn& cudnn, const Problem<T>& p, const Shape& s, CudnnBackwardMode mode, int dqkv_fill = 0xFF) {
  gpu::GpuContext plan_ctx;
  plan_ctx.cudnn = &cudnn;
  const size_t scratch = std::max(gpu::cudnn_attention_forward_scratch_bytes<T>(s.B, s.T, s.C, s.NH, plan_ctx),
                                  gpu::cudnn_attention_backward_scratch_bytes<T>(s.B, s.T, s.C, s.NH, plan_ctx, mode));
  test::GpuEnv env(scratch);
  env.ctx.cudnn = &cudnn;
  if (scratch > 0) ST_CUDA_CHECK(cudaMemset(env.scratch.data(), 0xFF, env.scratch.bytes()));
  DeviceBuffer<T> qkv = to_device<T>(p.qkv), dout = to_device<T>(p.dout);
  DeviceBuffer<T> out(s.out_size()), dqkv(s.qkv_size());
  DeviceBuffer<float> lse(s.lse_size());
  poison(out);
  poison(lse);
  ST_CUDA_CHECK(cudaMemset(dqkv.data(), dqkv_fill, dqkv.bytes()));
  ST_CUDA_CHECK(cudaDeviceSynchronize());
  gpu::cudnn_attention_forward<T>(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH, env.ctx);
  gpu::cudnn_attention_backward<T>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C, s.NH,
                                   env.ctx, mode);
  return GpuRun{to_host(out), to_host(lse), to_host(dqkv)};
}

// flash_attention forward + backward into a zeroed dqkv (it accumulates).
template <typename T>
GpuRun run_flash(const Problem<T>& p, const Shape& s) {
  test::GpuEnv env(gpu::flash_attention_backward_scratch_bytes(s.B, s.T, s.C, s.NH));
  DeviceBuffer<T> qkv = to_device<T>(p.qkv), dout = to_device<T>(p.dout);
  DeviceBuffer<T> out(s.out_size()), dqkv = to_device<T>(std::vector<float>(s.qkv_size(), 0.0f));
  DeviceBuffer<float> lse(s.lse_size());
  gpu::flash_attention_forward<T>(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH, env.ctx);
  gpu::flash_attention_backward<T>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C, s.NH,
                                   env.ctx);
  return GpuRun{to_host(out), to_host(lse), to_host(dqkv)};
}

void expect_close(const GpuRun& got, const std::vector<float>& out, const std::vector<float>& lse,
                  const std::vector<float>& dqkv, const Shape& s) {
  EXPECT_TRUE(matches(got.out, out, kTol)) << "out";
  EXPECT_TRUE(all_close(got.lse, lse, kLseTol, 1.0)) << "lse";
  for (int which = 0; which < 3; ++which) {
    EXPECT_TRUE(matches(part(got.dqkv, which, s), part(dqkv, which, s), kTol)) << "d" << std::string(1, "qkv"[which]);
  }
}

void expect_bitwise_equal(const GpuRun& a, const GpuRun& b) {
  EXPECT_TRUE(bitwise_equal(a.out, b.out)) << "out";
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse)) << "lse";
  EXPECT_TRUE(bitwise_equal(a.dqkv, b.dqkv)) << "dqkv";
}

template <typename T>
class CudnnAttentionGpu : public ::testing::Test {};
using CudnnTypes = ::testing::Types<bf16, fp16>;
TYPED_TEST_SUITE(CudnnAttentionGpu, CudnnTypes, test::ActivationNames);

TYPED_TEST(CudnnAttentionGpu, SupportedOnEveryTestShape) {
  ST_SKIP_WITHOUT_GPU();
  gpu::Cudnn cudnn;
  gpu::GpuContext ctx;
  ctx.cudnn = &cudnn;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << s);
    for (CudnnBackwardMode mode : {CudnnBackwardMode::kDeterministic, CudnnBackwardMode::kNondeterministic}) {
      // On failure the forward/backward scratch query throws with cuDNN's reason.
      if (!gpu::cudnn_attention_supported<TypeParam>(s.B, s.T, s.C, s.NH, ctx, mode)) {
        ADD_FAILURE() << "unsupported";
        gpu::cudnn_attention_forward_scratch_bytes<TypeParam>(s.B, s.T, s.C, s.NH, ctx);
        gpu::cudnn_attention_backward_scratch_bytes<TypeParam>(s.B, s.T, s.C, s.NH, ctx, mode);
      }
    }
  }
}

TYPED_TEST(CudnnAttentionGpu, DeterministicMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  gpu::Cudnn cudnn;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << s);
    const Problem<TypeParam> p(s);
    expect_close(run_cudnn(cudnn, p, s, CudnnBackwardMode::kDeterministic), p.out, p.lse, p.dqkv, s);
  }
}

TYPED_TEST(CudnnAttentionGpu, NondeterministicMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  gpu::Cudnn cudnn;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << s);
    const Problem<TypeParam> p(s);
    expect_close(run_cudnn(cudnn, p, s, CudnnBackwardMode::kNondeterministic), p.out, p.lse, p.dqkv, s);
  }
}

// Both approximate the same fp32 computation with T-rounded P and dS, so they agree as closely as each agrees
// with the CPU.
TYPED_TEST(CudnnAttentionGpu, MatchesFlashAttention) {
  ST_SKIP_WITHOUT_GPU();
  gpu::Cudnn cudnn;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << s);
    const Problem<TypeParam> p(s);
    const GpuRun flash = run_flash(p, s);
    expect_close(run_cudnn(cudnn, p, s, CudnnBackwardMode::kDeterministic), flash.out, flash.lse, flash.dqkv, s);
  }
}

// dqkv holding NaNs or finite garbage before the backward gives the same bits: it is written, never read.
TYPED_TEST(CudnnAttentionGpu, BackwardOverwritesDqkv) {
  ST_SKIP_WITHOUT_GPU();
  gpu::Cudnn cudnn;
  for (const Shape& s : {Shape{3, 100, 256, 4}, Shape{1, 256, 768, 12}}) {
    SCOPED_TRACE(::testing::Message() << s);
    const Problem<TypeParam> p(s);
    const GpuRun nan_filled = run_cudnn(cudnn, p, s, CudnnBackwardMode::kDeterministic, 0xFF);
    const GpuRun garbage_filled = run_cudnn(cudnn, p, s, CudnnBackwardMode::kDeterministic, 0x3C);
    EXPECT_TRUE(bitwise_equal(nan_filled.dqkv, garbage_filled.dqkv));
    EXPECT_TRUE(matches(nan_filled.dqkv, p.dqkv, kTol));  // and no NaN survived
  }
}

TYPED_TEST(CudnnAttentionGpu, DeterministicBackwardIsBitReproducible) {
  ST_SKIP_WITHOUT_GPU();
  for (const Shape& s : {Shape{3, 100, 256, 4}, Shape{1, 256, 768, 12}, Shape{2, 200, 256, 2}}) {
    SCOPED_TRACE(::testing::Message() << s);
    const Problem<TypeParam> p(s);
    gpu::Cudnn cudnn, other;  // a second handle re-plans: the engine choice must repeat too
    const GpuRun a = run_cudnn(cudnn, p, s, CudnnBackwardMode::kDeterministic);
    expect_bitwise_equal(a, run_cudnn(cudnn, p, s, CudnnBackwardMode::kDeterministic));
    expect_bitwise_equal(a, run_cudnn(other, p, s, CudnnBackwardMode::kDeterministic));
  }
}

TEST(CudnnAttentionGpuChecks, PlansAreCachedPerShapeAndPass) {
  ST_SKIP_WITHOUT_GPU();
  gpu::Cudnn cudnn;
  gpu::GpuContext ctx;
  ctx.cudnn = &cudnn;
  ASSERT_TRUE(gpu::cudnn_attention_supported<bf16>(2, 64, 128, 2, ctx));
  EXPECT_EQ(cudnn.plan_count(), 2u);  // forward, deterministic backward
  ASSERT_TRUE(gpu::cudnn_attention_supported<bf16>(2, 64, 128, 2, ctx));
  gpu::cudnn_attention_backward_scratch_bytes<bf16>(2, 64, 128, 2, ctx);
  EXPECT_EQ(cudnn.plan_count(), 2u);
  ASSERT_TRUE(gpu::cudnn_attention_supported<fp16>(2, 64, 128, 2, ctx));
  EXPECT_EQ(cudnn.plan_count(), 4u);
}

TEST(CudnnAttentionGpuChecks, ScratchSizeIsChecked) {
  ST_SKIP_WITHOUT_GPU();
  gpu::Cudnn cudnn;
  gpu::GpuContext ctx;
  ctx.cudnn = &cudnn;
  const size_t need = gpu::cudnn_attention_backward_scratch_bytes<bf16>(2, 64, 128, 2, ctx);
  ASSERT_GE(need, 256u);  // at least the dO.O row sums
  ctx.scratch_bytes = need - 256;
  // The scratch check comes before any device access; the message names both sizes.
  try {
    gpu::cudnn_attention_backward<bf16>(nullptr, nullptr, nullptr, nullptr, nullptr, 2, 64, 128, 2, ctx);
    ADD_FAILURE() << "no error for " << ctx.scratch_bytes << " bytes of scratch";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(std::to_string(need)), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(need - 256)), std::string::npos) << what;
  }
}

TEST(CudnnAttentionGpuChecks, Fp32AndMissingCudnnAreUnsupported) {
  ST_SKIP_WITHOUT_GPU();
  gpu::Cudnn cudnn;
  gpu::GpuContext ctx;
  EXPECT_FALSE(gpu::cudnn_attention_supported<bf16>(2, 64, 128, 2, ctx));  // ctx.cudnn is null
  ctx.cudnn = &cudnn;
  EXPECT_FALSE(gpu::cudnn_attention_supported<float>(2, 64, 128, 2, ctx));
  EXPECT_THROW(gpu::cudnn_attention_forward<float>(nullptr, nullptr, nullptr, 2, 64, 128, 2, ctx), Error);
  EXPECT_FALSE(gpu::cudnn_attention_supported<bf16>(2, 64, 12, 3, ctx));  // hs = 4: rows not 16-byte aligned
}

}  // namespace
}  // namespace st
