// gpu::lora_forward / gpu::lora_backward (cuBLASLt) against the CPU reference st::lora_*, for T = float (1e-5),
// bf16 and fp16 (1e-2): stacks of one to three adapters on slices of a wider output (row0 > 0, ldo > rows, a gap
// between slices, odd sizes everywhere), the output and input gradient added to or written, accumulating and written
// parameter gradients, dx null.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/gpu/lora.h"
#include "shardtrain/kernels/gpu/matmul.h"
#include "shardtrain/kernels/lora.h"

namespace st {
namespace {

using test::close;
using test::kTol;

// The half-precision adapter rounds twice on its way out: h = x A^T is stored in T before h B^T, and dh before dh A.
// Measured on an H200 (bf16): elements off by up to 1.7% of their size (floor included); 3x the one-GEMM bar.
template <typename T>
inline constexpr double kLoraTol = std::is_same_v<T, float> ? kTol<T> : 3 * kTol<T>;
using test::poison;
using test::random_input;
using test::to_device;
using test::to_host;

// N = 1 and N = 130; in, rows and ldo not multiples of 8 (rows of no 16-byte pitch); row0 odd (a 4- or 2-byte aligned
// output); rank 1, 2 and 3; q/k/v-like stacks of three, one with a gap.
struct Shape {
  int64_t N;
  LoraStack s;
  int ldo;
};
const Shape kShapes[] = {{1, {7, 1, {{0, 5}}}, 5},
                         {37, {13, 3, {{3, 11}}}, 19},
                         {130, {64, 3, {{96, 48}}}, 193},
                         {131, {40, 2, {{1, 9}}}, 17},
                         {130, {64, 3, {{0, 64}, {64, 16}, {80, 16}}}, 96},
                         {33, {20, 2, {{0, 10}, {15, 5}, {20, 7}}}, 27}};
constexpr float kScale = 5.0f / 3.0f;

// Random operands rounded through T, so that the CPU reference sees the GPU's values.
template <typename T>
struct Operands {
  Shape s;
  std::vector<float> x, A, B, out0, dout;
  Operands(const Shape& shape, uint64_t stream) : s(shape) {
    x = random_input<T>(s.N * s.s.in, stream);
    A = random_input<T>(int64_t{s.s.width()} * s.s.in, stream + 1, 0.3f);
    B = random_input<T>(s.s.b_rows() * s.s.r, stream + 2, 0.3f);
    out0 = random_input<T>(s.N * s.ldo, stream + 3);
    dout = random_input<T>(s.N * s.ldo, stream + 4);
  }
};

::testing::Message describe(const Shape& s) {
  ::testing::Message m;
  m << "N=" << s.N << " in=" << s.s.in << " r=" << s.s.r << " ldo=" << s.ldo;
  for (const LoraSlice& sl : s.s.slices) m << " [" << sl.row0 << "+" << sl.rows << "]";
  return m;
}

bool in_slices(const LoraStack& s, int64_t c) {
  for (const LoraSlice& sl : s.slices)
    if (c >= sl.row0 && c < sl.row0 + sl.rows) return true;
  return false;
}

struct Env {
  gpu::Blas blas;
  gpu::GpuContext ctx() { return {nullptr, &blas, nullptr, 0}; }
};

template <typename T>
class LoraGpu : public ::testing::Test {};
TYPED_TEST_SUITE(LoraGpu, test::ActivationTypes, test::ActivationNames);

// h and the whole output against the reference, added to and written (poisoned first): the slices' columns updated,
// the others' bits untouched.
TYPED_TEST(LoraGpu, ForwardMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  Env env;
  for (const Shape& s : kShapes) {
    for (const GradWrite w : {GradWrite::kAccumulate, GradWrite::kOverwrite}) {
      SCOPED_TRACE(describe(s) << " accumulate=" << (w == GradWrite::kAccumulate));
      const Operands<T> k(s, 100);
      std::vector<float> want_out = k.out0, want_h(s.N * s.s.width());
      lora_forward(want_out.data(), s.ldo, w, want_h.data(), k.x.data(), k.A.data(), k.B.data(), s.N, s.s, kScale);

      auto x = to_device<T>(k.x), A = to_device<T>(k.A), B = to_device<T>(k.B), out = to_device<T>(k.out0);
      DeviceBuffer<T> h(s.N * s.s.width());
      poison(h);
      gpu::lora_forward<T>(out.data(), s.ldo, w, h.data(), x.data(), A.data(), B.data(), s.N, s.s, kScale, env.ctx());
      const std::vector<float> got = to_host(out);
      EXPECT_TRUE(close(to_host(h), want_h, kLoraTol<T>)) << "h";
      EXPECT_TRUE(close(got, want_out, kLoraTol<T>)) << "out";
      for (int64_t n = 0; n < s.N; ++n)
        for (int c = 0; c < s.ldo; ++c)
          if (!in_slices(s.s, c)) ASSERT_EQ(got[n * s.ldo + c], k.out0[n * s.ldo + c]) << n << ", " << c;
    }
  }
}

// Both sides run from the same h (the GPU's, in T). Accumulate: dA, dB (or dx) add to random starting values. Write:
// poisoned first. dx null leaves dA and dB as they are with it.
TYPED_TEST(LoraGpu, BackwardMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  Env env;
  for (const Shape& s : kShapes) {
    const int64_t width = s.s.width();
    for (const GradWrite w : {GradWrite::kAccumulate, GradWrite::kOverwrite}) {
      const bool add = w == GradWrite::kAccumulate;
      const GradWrite xw = add ? GradWrite::kOverwrite : GradWrite::kAccumulate;  // both ways for each
      SCOPED_TRACE(describe(s) << " accumulate=" << add);
      const Operands<T> k(s, 200);
      auto x = to_device<T>(k.x), A = to_device<T>(k.A), B = to_device<T>(k.B), out = to_device<T>(k.out0);
      DeviceBuffer<T> h(s.N * width), dh(s.N * width);
      gpu::lora_forward<T>(out.data(), s.ldo, GradWrite::kAccumulate, h.data(), x.data(), A.data(), B.data(), s.N, s.s,
                           kScale, env.ctx());
      const std::vector<float> h_host = to_host(h);
      const std::vector<float> dA0 = random_input<T>(width * s.s.in, 210),
                               dB0 = random_input<T>(s.s.b_rows() * s.s.r, 211),
                               dx0 = random_input<T>(s.N * s.s.in, 212);
      std::vector<float> want_dA = dA0, want_dB = dB0, want_dx = dx0, want_dh(s.N * width);
      lora_backward(want_dx.data(), xw, want_dA.data(), want_dB.data(), want_dh.data(), k.dout.data(), s.ldo,
                    k.x.data(), h_host.data(), k.A.data(), k.B.data(), s.N, s.s, kScale, w);

      auto dout = to_device<T>(k.dout), dx = to_device<T>(dx0), dA = to_device<T>(dA0), dB = to_device<T>(dB0);
      if (!add) {
        poison(dA);
        poison(dB);
      } else {
        poison(dx);
      }
      poison(dh);
      gpu::lora_backward<T>(dx.data(), xw, dA.data(), dB.data(), dh.data(), dout.data(), s.ldo, x.data(), h.data(),
                            A.data(), B.data(), s.N, s.s, kScale, env.ctx(), w);
      EXPECT_TRUE(close(to_host(dA), want_dA, kLoraTol<T>)) << "dA";
      EXPECT_TRUE(close(to_host(dB), want_dB, kLoraTol<T>)) << "dB";
      EXPECT_TRUE(close(to_host(dx), want_dx, kLoraTol<T>)) << "dx";

      auto dA_alone = to_device<T>(dA0), dB_alone = to_device<T>(dB0);
      gpu::lora_backward<T>(nullptr, xw, dA_alone.data(), dB_alone.data(), dh.data(), dout.data(), s.ldo, x.data(),
                            h.data(), A.data(), B.data(), s.N, s.s, kScale, env.ctx(), w);
      EXPECT_TRUE(test::bitwise_equal(to_host(dA_alone), to_host(dA))) << "dA without dx";
      EXPECT_TRUE(test::bitwise_equal(to_host(dB_alone), to_host(dB))) << "dB without dx";
    }
  }
}

// No rows: written gradients are zero, accumulated ones keep their values, and nothing else is touched.
TYPED_TEST(LoraGpu, BackwardOverNoRows) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  Env env;
  const Shape& s = kShapes[4];
  const std::vector<float> A0 = random_input<T>(int64_t{s.s.width()} * s.s.in, 300),
                           B0 = random_input<T>(s.s.b_rows() * s.s.r, 301);
  auto A = to_device<T>(A0), B = to_device<T>(B0), dA = to_device<T>(A0), dB = to_device<T>(B0);
  gpu::lora_backward<T>(nullptr, GradWrite::kAccumulate, dA.data(), dB.data(), nullptr, nullptr, s.ldo, nullptr,
                        nullptr, A.data(), B.data(), 0, s.s, kScale, env.ctx());
  EXPECT_TRUE(test::bitwise_equal(to_host(dA), A0));
  EXPECT_TRUE(test::bitwise_equal(to_host(dB), B0));
  gpu::lora_backward<T>(nullptr, GradWrite::kAccumulate, dA.data(), dB.data(), nullptr, nullptr, s.ldo, nullptr,
                        nullptr, A.data(), B.data(), 0, s.s, kScale, env.ctx(), GradWrite::kOverwrite);
  EXPECT_EQ(to_host(dA), std::vector<float>(A0.size(), 0.0f));
  EXPECT_EQ(to_host(dB), std::vector<float>(B0.size(), 0.0f));
}

// Dropout draws the CPU's mask element for element (the same hash on the device): the dropped input and the input
// gradient equal the reference's within T's rounding of x / (1 - p), exactly in fp32; about a tenth of the elements
// dropped at p = 0.1, across two sequences of a micro-batch.
TYPED_TEST(LoraGpu, DropoutDrawsTheCpusMask) {
  using T = TypeParam;
  ST_SKIP_WITHOUT_GPU();
  Env env;
  for (const Shape& s : kShapes) {
    if (s.s.slices.size() != 1) continue;  // dropout runs each adapter alone
    SCOPED_TRACE(describe(s));
    const int in = s.s.in, r = s.s.r;
    const Operands<T> k(s, 300);
    LoraDropoutKey key;
    key.p = 0.1f;
    key.seed = 1337;
    key.stream = lora_dropout_stream(2, 5);
    key.first_sequence = 41;
    key.rows_per_sequence = std::max<int64_t>(1, s.N / 2);
    key.seq_stride = 200;
    std::vector<float> want(s.N * in);
    lora_dropout(want.data(), k.x.data(), s.N, in, key);
    auto x = to_device<T>(k.x);
    DeviceBuffer<T> out(s.N * in);
    poison(out);
    gpu::lora_dropout<T>(out.data(), x.data(), s.N, in, key, env.ctx());
    const std::vector<float> got = to_host(out);
    int64_t dropped = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i] == 0.0f, want[i] == 0.0f) << "element " << i << ": the masks differ";
      dropped += want[i] == 0.0f && k.x[i] != 0.0f;
    }
    EXPECT_TRUE(close(got, want, kTol<T>));
    if (s.N * in >= 1000) EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(want.size()), 0.1, 0.03);

    // dx += mask / (1 - p) (dh A)
    const std::vector<float> dh = random_input<T>(s.N * r, 310), dx0 = random_input<T>(s.N * in, 311);
    std::vector<float> want_dx = dx0, want_dxd(s.N * in);
    lora_dropout_backward(want_dx.data(), want_dxd.data(), dh.data(), k.A.data(), s.N, in, r, key);
    auto d_dh = to_device<T>(dh), d_A = to_device<T>(k.A), d_dx = to_device<T>(dx0);
    DeviceBuffer<T> dxd(s.N * in);
    gpu::lora_dropout_backward<T>(d_dx.data(), dxd.data(), d_dh.data(), d_A.data(), s.N, in, r, key, env.ctx());
    EXPECT_TRUE(close(to_host(d_dx), want_dx, kLoraTol<T>)) << "dx";
  }
}

}  // namespace
}  // namespace st
