// st::gpu::flash_attention_* against the CPU reference st::attention_* (out, dqkv) and a double-precision
// logsumexp of the scores (lse), for T = float (the generic fp32 path), bf16 and fp16 (the tensor-core path at
// hs = 16, 32, 64, 128; the generic one elsewhere); and bit-for-bit reproducibility.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <vector>

#include "attention_gpu_test.h"
#include "gpu_kernel_test.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/attention.h"
#include "shardtrain/kernels/gpu/flash_attention.h"

namespace st {
namespace {

using test::all_close;
using test::bitwise_equal;
using test::cpu_lse;
using test::matches;
using test::part;
using test::poison;
using test::random_input;
using test::to_device;
using test::to_host;

// out and dqkv: max |got - want| <= tol * max |want| (as attention_gpu_test.cc). float: the fp32 path differs
// from the CPU by summation order and a few ulps of exp. bf16/fp16: the products consume P and dS rounded to
// T, whose error scales with the terms rather than with the result.
template <typename T>
inline constexpr double kTol = std::is_same_v<T, float> ? 1e-5 : 2e-2;
// lse: |got - want| <= tol * max(|want|, 1). The scores are exact products of the T operands summed in fp32
// on every path, so lse is fp32-accurate for every T; 1 is the scale of the score terms for unit normals
// (an lse near 0 is a sum of terms of either sign, not a small number computed to relative precision).
template <typename T>
inline constexpr double kLseTol = std::is_same_v<T, float> ? 1e-5 : 1e-4;

using Shape = test::AttentionShape;

// hs 4 (generic), 16 with a single token, 64 with a tail (67 = 64 + 3), 64 over two full tiles, 32 with a
// tail, 128, 16 with a tail; then hs 128 over three tiles with a tail (the backward's 32-row inner tiles), hs 64
// over five tiles, and hs 20 (generic) over several 32-key rounds.
const Shape kShapes[] = {{2, 5, 12, 3},   {1, 1, 16, 1},  {2, 67, 128, 2},  {1, 128, 256, 4}, {2, 33, 64, 2},
                         {1, 64, 256, 2}, {1, 40, 48, 3}, {1, 150, 256, 2}, {1, 300, 128, 2}, {2, 100, 40, 2}};

// Inputs and CPU results; dqkv0 is the non-zero gradient both backward passes accumulate into.
template <typename T>
struct Problem : test::AttentionProblem<T> {
  explicit Problem(const Shape& s) : test::AttentionProblem<T>(s, 1100, test::InitialGrad::kRandom) {}
};

// Device outputs of one forward + backward.
template <typename T>
struct GpuRun {
  std::vector<float> out, lse, dqkv;
};

// Runs flash forward then backward on the device (backward consumes the device forward's out and lse), with a
// poisoned out, lse and scratch. `offset` elements of padding before every T tensor (1 misaligns them).
template <typename T>
GpuRun<T> run_gpu(const Problem<T>& p, const Shape& s, int offset = 0) {
  test::GpuEnv env(gpu::flash_attention_backward_scratch_bytes(s.B, s.T, s.C, s.NH));
  ST_CUDA_CHECK(cudaMemset(env.scratch.data(), 0xFF, env.scratch.bytes()));  // must not be relied on
  DeviceBuffer<T> qkv = test::upload<T>(p.qkv, offset), dout = test::upload<T>(p.dout, offset);
  DeviceBuffer<T> dqkv = test::upload<T>(p.dqkv0, offset);
  DeviceBuffer<T> out(s.out_size() + offset);
  DeviceBuffer<float> lse(s.lse_size());
  poison(out);
  poison(lse);
  gpu::flash_attention_forward<T>(out.data() + offset, lse.data(), qkv.data() + offset, s.B, s.T, s.C, s.NH, env.ctx);
  GpuRun<T> r;
  r.out = test::download(out, offset);
  r.lse = to_host(lse);
  gpu::flash_attention_backward<T>(dqkv.data() + offset, dout.data() + offset, qkv.data() + offset, out.data() + offset,
                                   lse.data(), s.B, s.T, s.C, s.NH, env.ctx);
  r.dqkv = test::download(dqkv, offset);
  return r;
}

template <typename T>
void expect_matches_cpu(const GpuRun<T>& got, const Problem<T>& want, const Shape& s) {
  EXPECT_TRUE(matches(got.out, want.out, kTol<T>)) << "out";
  EXPECT_TRUE(all_close(got.lse, want.lse, kLseTol<T>, 1.0)) << "lse";
  for (int which = 0; which < 3; ++which) {
    EXPECT_TRUE(matches(part(got.dqkv, which, s), part(want.dqkv, which, s), kTol<T>))
        << "d" << std::string(1, "qkv"[which]);
  }
}

template <typename T>
class FlashAttentionGpu : public ::testing::Test {};
TYPED_TEST_SUITE(FlashAttentionGpu, test::ActivationTypes, test::ActivationNames);

TYPED_TEST(FlashAttentionGpu, ForwardMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << s);
    const std::vector<float> qkv = random_input<T>(s.qkv_size(), 1000);
    std::vector<float> want_out(s.out_size()), att(s.att_size());
    attention_forward(want_out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    const std::vector<float> want_lse = cpu_lse(qkv, s);

    test::GpuEnv env;
    DeviceBuffer<T> d_qkv = to_device<T>(qkv);
    DeviceBuffer<T> out(s.out_size());
    DeviceBuffer<float> lse(s.lse_size());
    poison(out);
    poison(lse);
    gpu::flash_attention_forward<T>(out.data(), lse.data(), d_qkv.data(), s.B, s.T, s.C, s.NH, env.ctx);
    EXPECT_TRUE(matches(to_host(out), want_out, kTol<T>));
    EXPECT_TRUE(all_close(to_host(lse), want_lse, kLseTol<T>, 1.0));
  }
}

TYPED_TEST(FlashAttentionGpu, BackwardAccumulatesLikeCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << s);
    const Problem<T> p(s);
    expect_matches_cpu(run_gpu(p, s), p, s);
  }
}

// Pointers one element off 16-byte alignment: bf16/fp16 leave the tensor-core path at hs = 64 and 128.
TYPED_TEST(FlashAttentionGpu, MisalignedPointersMatchCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : {Shape{2, 67, 128, 2}, Shape{1, 40, 256, 2}}) {
    SCOPED_TRACE(::testing::Message() << s);
    const Problem<T> p(s);
    expect_matches_cpu(run_gpu(p, s, /*offset=*/1), p, s);
  }
}

TYPED_TEST(FlashAttentionGpu, BitReproducible) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : {Shape{2, 150, 256, 4}, Shape{1, 130, 256, 2}, Shape{2, 37, 40, 2}}) {
    SCOPED_TRACE(::testing::Message() << s);
    const Problem<T> p(s);
    const GpuRun<T> a = run_gpu(p, s), b = run_gpu(p, s);
    EXPECT_TRUE(bitwise_equal(a.out, b.out));
    EXPECT_TRUE(bitwise_equal(a.lse, b.lse));
    EXPECT_TRUE(bitwise_equal(a.dqkv, b.dqkv));
  }
}

TEST(FlashAttentionGpuScratch, SizedAndChecked) {
  ST_SKIP_WITHOUT_GPU();
  EXPECT_EQ(gpu::flash_attention_backward_scratch_bytes(2, 67, 128, 2), 1280u);  // 2*2*67 floats, to 256 bytes
  test::GpuEnv env(gpu::flash_attention_backward_scratch_bytes(2, 67, 128, 2) - 256);
  // The shape and scratch checks come before any device access.
  EXPECT_THROW(gpu::flash_attention_backward<bf16>(nullptr, nullptr, nullptr, nullptr, nullptr, 2, 67, 128, 2, env.ctx),
               Error);
}

}  // namespace
}  // namespace st
