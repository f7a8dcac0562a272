// Grouped-query attention (NKV < NH key/value heads) on the GPU: st::gpu::flash_attention_* (float, bf16, fp16)
// and st::gpu::cudnn_attention_* (bf16, fp16) in their (NH, NKV, hs) forms against the CPU reference
// st::attention_* element by element (out, each of dq/dk/dv) and a double-precision logsumexp (lse); reruns
// bit-identical; NKV = NH through the grouped forms equal to the (C, NH) forms bit for bit; the plan cache keyed
// by NKV. Shapes: hs 64 and 128; NH/NKV 4/1, 8/2 and 14/2 (Qwen2.5-0.5B: 14 query heads, 2 K/V heads, hs 64); T
// not a multiple of the 64-row tile; one head size (40) off the tensor-core path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <type_traits>
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

using Shape = test::AttentionShape;

// NH query heads of hs, NKV K/V heads.
constexpr Shape gqa(int B, int T, int NH, int NKV, int hs) { return Shape{B, T, NH * hs, NH, NKV}; }

// out and dqkv: max |got - want| <= tol * max |want|, as flash_attention_gpu_test.cc. bf16/fp16: the products
// consume P and dS rounded to T, whose error scales with the terms. float: the CPU and the GPU sum a K/V head's
// gradient over NH/NKV query heads x T queries (up to 7 x 200 terms here) in different orders; 3e-5 is 500 fp32
// ulps of the largest element, while a missing or misrouted query head is an O(1e-1) error.
template <typename T>
inline constexpr double kTol = std::is_same_v<T, float> ? 3e-5 : 2e-2;
// lse: |got - want| <= tol * max(|want|, 1), as flash_attention_gpu_test.cc (fp32-accurate scores on every path).
template <typename T>
inline constexpr double kLseTol = std::is_same_v<T, float> ? 1e-5 : 1e-4;

// The tensor-core head sizes (64, 128) with 1, 2 and 7 query heads per K/V head, T past a 64-row tile boundary
// (67, 100, 130, 200); the generic path at hs = 40.
const Shape kShapes[] = {gqa(2, 100, 4, 1, 64),  gqa(1, 130, 8, 2, 64),  gqa(1, 200, 14, 2, 64), gqa(2, 67, 4, 1, 128),
                         gqa(1, 130, 8, 2, 128), gqa(1, 64, 14, 2, 128), gqa(1, 50, 4, 2, 40)};

// cuDNN needs hs a multiple of 8, which every shape above has.
const Shape kCudnnShapes[] = {gqa(2, 100, 4, 1, 64), gqa(1, 130, 8, 2, 64), gqa(1, 200, 14, 2, 64),
                              gqa(2, 67, 4, 1, 128), gqa(1, 130, 8, 2, 128)};

struct GpuRun {
  std::vector<float> out, lse, dqkv;
};

// Which entry points a run calls: the (NH, NKV, hs) forms, or the (C, NH) forms (shapes with NKV = NH only).
enum class Form { kGrouped, kMultiHead };

// Flash forward, then backward (on the device forward's out and lse) into dqkv0, which it accumulates into; out,
// lse and scratch poisoned (NaN) first.
template <typename T>
GpuRun run_flash(const test::AttentionProblem<T>& p, const Shape& s, Form form = Form::kGrouped) {
  test::GpuEnv env(gpu::flash_attention_backward_scratch_bytes(s.B, s.T, s.NH, s.kv(), s.hs()));
  ST_CUDA_CHECK(cudaMemset(env.scratch.data(), 0xFF, env.scratch.bytes()));
  DeviceBuffer<T> qkv = to_device<T>(p.qkv), dout = to_device<T>(p.dout), dqkv = to_device<T>(p.dqkv0);
  DeviceBuffer<T> out(s.out_size());
  DeviceBuffer<float> lse(s.lse_size());
  poison(out);
  poison(lse);
  if (form == Form::kGrouped) {
    gpu::flash_attention_forward<T>(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.kv(), s.hs(), env.ctx);
    gpu::flash_attention_backward<T>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.NH,
                                     s.kv(), s.hs(), env.ctx);
  } else {
    gpu::flash_attention_forward<T>(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH, env.ctx);
    gpu::flash_attention_backward<T>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C, s.NH,
                                     env.ctx);
  }
  return GpuRun{to_host(out), to_host(lse), to_host(dqkv)};
}

// cuDNN forward, then backward, with out, lse, scratch and dqkv poisoned (NaN): the backward overwrites dqkv.
template <typename T>
GpuRun run_cudnn(gpu::Cudnn& cudnn, const test::AttentionProblem<T>& p, const Shape& s, CudnnBackwardMode mode,
                 Form form = Form::kGrouped) {
  gpu::GpuContext plan_ctx;
  plan_ctx.cudnn = &cudnn;
  const bool grouped = form == Form::kGrouped;
  const size_t scratch =
      grouped ? std::max(gpu::cudnn_attention_forward_scratch_bytes<T>(s.B, s.T, s.NH, s.kv(), s.hs(), plan_ctx),
                         gpu::cudnn_attention_backward_scratch_bytes<T>(s.B, s.T, s.NH, s.kv(), s.hs(), plan_ctx, mode))
              : std::max(gpu::cudnn_attention_forward_scratch_bytes<T>(s.B, s.T, s.C, s.NH, plan_ctx),
                         gpu::cudnn_attention_backward_scratch_bytes<T>(s.B, s.T, s.C, s.NH, plan_ctx, mode));
  test::GpuEnv env(scratch);
  env.ctx.cudnn = &cudnn;
  if (scratch > 0) ST_CUDA_CHECK(cudaMemset(env.scratch.data(), 0xFF, env.scratch.bytes()));
  DeviceBuffer<T> qkv = to_device<T>(p.qkv), dout = to_device<T>(p.dout);
  DeviceBuffer<T> out(s.out_size()), dqkv(s.qkv_size());
  DeviceBuffer<float> lse(s.lse_size());
  poison(out);
  poison(lse);
  poison(dqkv);
  if (grouped) {
    gpu::cudnn_attention_forward<T>(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.kv(), s.hs(), env.ctx);
    gpu::cudnn_attention_backward<T>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.NH,
                                     s.kv(), s.hs(), env.ctx, mode);
  } else {
    gpu::cudnn_attention_forward<T>(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH, env.ctx);
    gpu::cudnn_attention_backward<T>(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.C, s.NH,
                                     env.ctx, mode);
  }
  return GpuRun{to_host(out), to_host(lse), to_host(dqkv)};
}

template <typename T>
void expect_matches_cpu(const GpuRun& got, const test::AttentionProblem<T>& want, const Shape& s) {
  EXPECT_TRUE(matches(got.out, want.out, kTol<T>)) << "out";
  EXPECT_TRUE(all_close(got.lse, want.lse, kLseTol<T>, 1.0)) << "lse";
  for (int which = 0; which < 3; ++which) {
    EXPECT_TRUE(matches(part(got.dqkv, which, s), part(want.dqkv, which, s), kTol<T>))
        << "d" << std::string(1, "qkv"[which]);
  }
}

void expect_bitwise_equal(const GpuRun& a, const GpuRun& b) {
  EXPECT_TRUE(bitwise_equal(a.out, b.out)) << "out";
  EXPECT_TRUE(bitwise_equal(a.lse, b.lse)) << "lse";
  EXPECT_TRUE(bitwise_equal(a.dqkv, b.dqkv)) << "dqkv";
}

// ---------------------------------------------------------------------------------------------------------------
// Flash attention

template <typename T>
class FlashAttentionGqaGpu : public ::testing::Test {};
TYPED_TEST_SUITE(FlashAttentionGqaGpu, test::ActivationTypes, test::ActivationNames);

// The backward accumulates into a random dqkv0 (the CPU reference adds to the same).
TYPED_TEST(FlashAttentionGqaGpu, MatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << s);
    const test::AttentionProblem<TypeParam> p(s, 1300, test::InitialGrad::kRandom);
    expect_matches_cpu(run_flash(p, s), p, s);
  }
}

TYPED_TEST(FlashAttentionGqaGpu, BitReproducible) {
  ST_SKIP_WITHOUT_GPU();
  for (const Shape& s : {gqa(1, 200, 14, 2, 64), gqa(2, 67, 4, 1, 128), gqa(1, 50, 4, 2, 40)}) {
    SCOPED_TRACE(::testing::Message() << s);
    const test::AttentionProblem<TypeParam> p(s, 1310, test::InitialGrad::kRandom);
    expect_bitwise_equal(run_flash(p, s), run_flash(p, s));
  }
}

// The (C, NH) forms are the grouped ones at NKV = NH: same kernels, same bits.
TYPED_TEST(FlashAttentionGqaGpu, UngroupedEqualsMultiHeadForms) {
  ST_SKIP_WITHOUT_GPU();
  for (const Shape& s : {Shape{2, 100, 256, 4}, Shape{1, 130, 256, 2}, Shape{1, 37, 80, 2}}) {
    SCOPED_TRACE(::testing::Message() << s);
    const test::AttentionProblem<TypeParam> p(s, 1320, test::InitialGrad::kRandom);
    expect_bitwise_equal(run_flash(p, s), run_flash(p, s, Form::kMultiHead));
  }
}

TEST(FlashAttentionGqaGpuChecks, RejectsQueryHeadsNotAMultipleOfKvHeads) {
  ST_SKIP_WITHOUT_GPU();
  test::GpuEnv env(gpu::flash_attention_backward_scratch_bytes(1, 8, 6, 4, 64));
  // The shape check comes before any device access.
  EXPECT_THROW(gpu::flash_attention_forward<bf16>(nullptr, nullptr, nullptr, 1, 8, 6, 4, 64, env.ctx), Error);
  EXPECT_THROW(
      gpu::flash_attention_backward<bf16>(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 8, 6, 4, 64, env.ctx), Error);
  // D is per query head: B * NH * T floats, rounded up to 256 bytes, whatever NKV.
  EXPECT_EQ(gpu::flash_attention_backward_scratch_bytes(2, 67, 14, 2, 64), 7680u);  // 2*14*67*4 = 7504
}

// ---------------------------------------------------------------------------------------------------------------
// cuDNN

template <typename T>
class CudnnAttentionGqaGpu : public ::testing::Test {};
using CudnnTypes = ::testing::Types<bf16, fp16>;
TYPED_TEST_SUITE(CudnnAttentionGqaGpu, CudnnTypes, test::ActivationNames);

// Both backward modes: supported (plans built), then run against the CPU. An unsupported shape fails in
// run_cudnn's scratch query with cuDNN's reason.
TYPED_TEST(CudnnAttentionGqaGpu, SupportedAndMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  gpu::Cudnn cudnn;
  gpu::GpuContext ctx;
  ctx.cudnn = &cudnn;
  for (const Shape& s : kCudnnShapes) {
    const test::AttentionProblem<TypeParam> p(s, 1400, test::InitialGrad::kZero);
    for (CudnnBackwardMode mode : {CudnnBackwardMode::kDeterministic, CudnnBackwardMode::kNondeterministic}) {
      SCOPED_TRACE(::testing::Message() << s << (mode == CudnnBackwardMode::kDeterministic ? " det" : " nondet"));
      EXPECT_TRUE(gpu::cudnn_attention_supported<TypeParam>(s.B, s.T, s.NH, s.kv(), s.hs(), ctx, mode));
      expect_matches_cpu(run_cudnn(cudnn, p, s, mode), p, s);
    }
  }
}

TYPED_TEST(CudnnAttentionGqaGpu, DeterministicBackwardIsBitReproducible) {
  ST_SKIP_WITHOUT_GPU();
  for (const Shape& s : {gqa(1, 200, 14, 2, 64), gqa(2, 67, 4, 1, 128)}) {
    SCOPED_TRACE(::testing::Message() << s);
    const test::AttentionProblem<TypeParam> p(s, 1410, test::InitialGrad::kZero);
    gpu::Cudnn cudnn, other;  // a second handle re-plans: the engine choice must repeat too
    const GpuRun a = run_cudnn(cudnn, p, s, CudnnBackwardMode::kDeterministic);
    expect_bitwise_equal(a, run_cudnn(cudnn, p, s, CudnnBackwardMode::kDeterministic));
    expect_bitwise_equal(a, run_cudnn(other, p, s, CudnnBackwardMode::kDeterministic));
  }
}

// The (C, NH) forms plan and run the same graphs as the grouped forms at NKV = NH: one plan each, same bits.
TYPED_TEST(CudnnAttentionGqaGpu, UngroupedEqualsMultiHeadForms) {
  ST_SKIP_WITHOUT_GPU();
  const Shape s{3, 100, 256, 4};
  const test::AttentionProblem<TypeParam> p(s, 1420, test::InitialGrad::kZero);
  gpu::Cudnn cudnn;
  const GpuRun grouped = run_cudnn(cudnn, p, s, CudnnBackwardMode::kDeterministic);
  EXPECT_EQ(cudnn.plan_count(), 2u);
  expect_bitwise_equal(grouped, run_cudnn(cudnn, p, s, CudnnBackwardMode::kDeterministic, Form::kMultiHead));
  EXPECT_EQ(cudnn.plan_count(), 2u);  // the same cache entries
}

// cuDNN against flash attention on the same grouped inputs (flash accumulating into zero).
TYPED_TEST(CudnnAttentionGqaGpu, MatchesFlashAttention) {
  ST_SKIP_WITHOUT_GPU();
  gpu::Cudnn cudnn;
  for (const Shape& s : {gqa(1, 200, 14, 2, 64), gqa(2, 67, 4, 1, 128)}) {
    SCOPED_TRACE(::testing::Message() << s);
    const test::AttentionProblem<TypeParam> p(s, 1430, test::InitialGrad::kZero);
    const GpuRun flash = run_flash(p, s);
    const GpuRun cudnn_run = run_cudnn(cudnn, p, s, CudnnBackwardMode::kDeterministic);
    EXPECT_TRUE(matches(cudnn_run.out, flash.out, kTol<TypeParam>)) << "out";
    EXPECT_TRUE(all_close(cudnn_run.lse, flash.lse, kLseTol<TypeParam>, 1.0)) << "lse";
    for (int which = 0; which < 3; ++which) {
      EXPECT_TRUE(matches(part(cudnn_run.dqkv, which, s), part(flash.dqkv, which, s), kTol<TypeParam>))
          << "d" << std::string(1, "qkv"[which]);
    }
  }
}

TEST(CudnnAttentionGqaGpuChecks, PlansAreCachedPerKvHeads) {
  ST_SKIP_WITHOUT_GPU();
  gpu::Cudnn cudnn;
  gpu::GpuContext ctx;
  ctx.cudnn = &cudnn;
  ASSERT_TRUE(gpu::cudnn_attention_supported<bf16>(2, 64, 8, 2, 64, ctx));
  EXPECT_EQ(cudnn.plan_count(), 2u);  // forward, deterministic backward
  ASSERT_TRUE(gpu::cudnn_attention_supported<bf16>(2, 64, 8, 2, 64, ctx));
  EXPECT_EQ(cudnn.plan_count(), 2u);
  ASSERT_TRUE(gpu::cudnn_attention_supported<bf16>(2, 64, 8, 1, 64, ctx));
  EXPECT_EQ(cudnn.plan_count(), 4u);
  ASSERT_TRUE(gpu::cudnn_attention_supported<bf16>(2, 64, 8, 8, 64, ctx));
  EXPECT_EQ(cudnn.plan_count(), 6u);
  // NH not a multiple of NKV is an invalid shape, not an unsupported one.
  EXPECT_THROW(gpu::cudnn_attention_supported<bf16>(2, 64, 8, 3, 64, ctx), Error);
}

}  // namespace
}  // namespace st
