// st::gpu attention against the CPU reference st::attention_*, for T = float (1e-5), bf16 and fp16 (1e-2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/attention.h"
#include "shardtrain/kernels/gpu/attention.h"
#include "shardtrain/kernels/gpu/matmul.h"

namespace st {
namespace {

using test::all_close;
using test::kTol;
using test::poison;
using test::random_input;
using test::round_through;
using test::to_device;
using test::to_host;

// max |got - want| <= rtol * max |want| (all_close with the largest |want| as floor, not test::close's
// tenth of it): the CPU tests' max_rel_diff. In bf16 and fp16 the products consume rounded intermediates
// (att, dP, dS) whose error scales with the terms, not the result. A CPU emulation of the bf16 pipeline on
// these shapes gives at most 5e-3 by this measure, but up to 4e-2 with test::close's floor.
::testing::AssertionResult matches(const std::vector<float>& got, const std::vector<float>& want, double rtol) {
  double amax = 0;
  for (float w : want) amax = std::max(amax, std::fabs(static_cast<double>(w)));
  return all_close(got, want, rtol, amax);
}

struct Shape {
  int B, T, C, NH;
  int64_t qkv_size() const { return static_cast<int64_t>(B) * T * 3 * C; }
  int64_t out_size() const { return static_cast<int64_t>(B) * T * C; }
  int64_t att_size() const { return static_cast<int64_t>(B) * NH * T * T; }
};

// The q (which = 0), k or v part of a [B,T,3C] tensor: their gradients differ in scale, so each is compared
// against its own magnitude.
std::vector<float> part(const std::vector<float>& qkv, int which, const Shape& s) {
  std::vector<float> x;
  x.reserve(s.out_size());
  for (int64_t row = 0; row < static_cast<int64_t>(s.B) * s.T; ++row) {
    const auto first = qkv.begin() + row * 3 * s.C + which * s.C;
    x.insert(x.end(), first, first + s.C);
  }
  return x;
}

// Odd sizes (hs = 4, T = 5), a single token, and a GPT-2-like head size.
const Shape kShapes[] = {{2, 5, 12, 3}, {1, 1, 8, 2}, {3, 17, 40, 5}, {2, 64, 64, 4}};

// Stream 0: the test helpers' cudaMemcpy/cudaMemset run there too, so everything is ordered.
struct Env {
  gpu::Blas blas;
  DeviceBuffer<char> scratch;
  explicit Env(size_t scratch_bytes) : scratch(static_cast<int64_t>(std::max<size_t>(scratch_bytes, 1))) {
    poison(scratch);  // kernels must not depend on what scratch held
  }
  gpu::GpuContext ctx() { return {nullptr, &blas, scratch.data(), static_cast<size_t>(scratch.size())}; }
};

template <typename T>
class AttentionGpu : public ::testing::Test {};
TYPED_TEST_SUITE(AttentionGpu, test::ActivationTypes, test::ActivationNames);

TYPED_TEST(AttentionGpu, ForwardMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    const std::vector<float> qkv = random_input<T>(s.qkv_size(), 700);
    std::vector<float> want_out(s.out_size()), want_att(s.att_size());
    attention_forward(want_out.data(), want_att.data(), qkv.data(), s.B, s.T, s.C, s.NH);

    Env env(gpu::attention_forward_scratch_bytes<T>(s.B, s.T, s.C, s.NH));
    auto d_qkv = to_device<T>(qkv);
    DeviceBuffer<T> out(s.out_size()), att(s.att_size());
    poison(out);
    poison(att);  // the zeros above the diagonal must be written too
    gpu::attention_forward<T>(out.data(), att.data(), d_qkv.data(), s.B, s.T, s.C, s.NH, env.ctx());
    EXPECT_TRUE(matches(to_host(att), want_att, kTol<T>));
    EXPECT_TRUE(matches(to_host(out), want_out, kTol<T>));
  }
}

TYPED_TEST(AttentionGpu, BackwardAccumulatesLikeCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH);
    const std::vector<float> qkv = random_input<T>(s.qkv_size(), 800);
    const std::vector<float> dout = random_input<T>(s.out_size(), 801);
    // Both sides get the same saved probabilities (the CPU's, in T) and the same non-zero starting dqkv.
    std::vector<float> out(s.out_size()), att(s.att_size());
    attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    att = round_through<T>(att);
    const std::vector<float> dqkv0 = random_input<T>(s.qkv_size(), 802, 0.1f);  // ~ the gradients' scale
    std::vector<float> want = dqkv0;
    attention_backward(want.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.C, s.NH);

    Env env(gpu::attention_backward_scratch_bytes<T>(s.B, s.T, s.C, s.NH));
    auto d_qkv = to_device<T>(qkv), d_dout = to_device<T>(dout), d_att = to_device<T>(att);
    auto dqkv = to_device<T>(dqkv0);
    gpu::attention_backward<T>(dqkv.data(), d_dout.data(), d_qkv.data(), d_att.data(), s.B, s.T, s.C, s.NH, env.ctx());
    const std::vector<float> got = to_host(dqkv);
    for (int which = 0; which < 3; ++which) {
      SCOPED_TRACE("d" + std::string(1, "qkv"[which]));
      EXPECT_TRUE(matches(part(got, which, s), part(want, which, s), kTol<T>));
    }
  }
}

}  // namespace
}  // namespace st
