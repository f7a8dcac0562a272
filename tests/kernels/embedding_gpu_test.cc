// gpu::embedding_* against the CPU reference st::embedding_*.
#include <gtest/gtest.h>

#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/embedding.h"
#include "shardtrain/kernels/gpu/embedding.h"

namespace st {
namespace {

using test::close;
using test::kTol;
using test::to_device;
using test::to_host;

struct Shape {
  int B, T, C, Vp;
};
// C = 1 and 7: scalar path; 40, 64, 256: packed path. Small Vp makes tokens repeat, so dwte sums runs.
const Shape kShapes[] = {{1, 1, 1, 1}, {2, 3, 7, 5}, {3, 17, 64, 11}, {4, 33, 40, 50}, {2, 64, 256, 1000}};

// Device copies of one problem; wpe has one row more than T (wpe is [>= T, C]).
template <typename T>
struct Problem {
  explicit Problem(const Shape& s)
      : tokens(test::random_ints(int64_t{s.B} * s.T, s.Vp, 1)),
        wte(test::random_input<T>(int64_t{s.Vp} * s.C, 2)),
        wpe(test::random_input<T>(int64_t{s.T + 1} * s.C, 3)),
        dout(test::random_input<T>(int64_t{s.B} * s.T * s.C, 4)),
        d_tokens(test::ints_to_device(tokens)),
        d_wte(to_device<T>(wte)),
        d_wpe(to_device<T>(wpe)),
        d_dout(to_device<T>(dout)) {}
  std::vector<int32_t> tokens;
  std::vector<float> wte, wpe, dout;
  DeviceBuffer<int32_t> d_tokens;
  DeviceBuffer<T> d_wte, d_wpe, d_dout;
};

template <typename T>
class EmbeddingGpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(EmbeddingGpuTest, test::ActivationTypes, test::ActivationNames);

TYPED_TEST(EmbeddingGpuTest, ForwardMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " Vp=" << s.Vp);
    const Problem<T> p(s);
    std::vector<float> want(int64_t{s.B} * s.T * s.C);
    embedding_forward(want.data(), p.tokens.data(), p.wte.data(), p.wpe.data(), s.B, s.T, s.C);

    test::GpuEnv env;
    DeviceBuffer<T> out(static_cast<int64_t>(want.size()));
    test::poison(out);
    gpu::embedding_forward<T>(out.data(), p.d_tokens.data(), p.d_wte.data(), p.d_wpe.data(), s.B, s.T, s.C, env.ctx);
    EXPECT_TRUE(close(to_host(out), want, kTol<T>));
  }
}

TYPED_TEST(EmbeddingGpuTest, BackwardAccumulatesLikeCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " Vp=" << s.Vp);
    const Problem<T> p(s);
    // Non-zero starting gradients on both sides: the kernels accumulate.
    std::vector<float> dwte = test::random_input<T>(int64_t{s.Vp} * s.C, 5);
    std::vector<float> dwpe = test::random_input<T>(int64_t{s.T + 1} * s.C, 6);
    DeviceBuffer<T> d_dwte = to_device<T>(dwte), d_dwpe = to_device<T>(dwpe);
    embedding_backward(dwte.data(), dwpe.data(), p.dout.data(), p.tokens.data(), s.B, s.T, s.C);

    test::GpuEnv env(gpu::embedding_backward_scratch_bytes(s.B, s.T, s.C));
    gpu::embedding_backward<T>(d_dwte.data(), d_dwpe.data(), p.d_dout.data(), p.d_tokens.data(), s.B, s.T, s.C,
                               env.ctx);
    EXPECT_TRUE(close(to_host(d_dwte), dwte, kTol<T>)) << "dwte";
    EXPECT_TRUE(close(to_host(d_dwpe), dwpe, kTol<T>)) << "dwpe";
  }
}

// wpe / dwpe null (no position embedding, llama): out = wte[tokens], and only dwte is accumulated.
TYPED_TEST(EmbeddingGpuTest, WithoutPositionEmbeddingMatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "B=" << s.B << " T=" << s.T << " C=" << s.C << " Vp=" << s.Vp);
    const Problem<T> p(s);
    std::vector<float> want(int64_t{s.B} * s.T * s.C);
    embedding_forward(want.data(), p.tokens.data(), p.wte.data(), nullptr, s.B, s.T, s.C);
    test::GpuEnv env(gpu::embedding_backward_scratch_bytes(s.B, s.T, s.C));
    DeviceBuffer<T> out(static_cast<int64_t>(want.size()));
    test::poison(out);
    gpu::embedding_forward<T>(out.data(), p.d_tokens.data(), p.d_wte.data(), nullptr, s.B, s.T, s.C, env.ctx);
    // A copy of wte's rows: exact in every type.
    EXPECT_TRUE(test::bitwise_equal(to_host(out), want)) << "out";

    std::vector<float> dwte = test::random_input<T>(int64_t{s.Vp} * s.C, 5);
    DeviceBuffer<T> d_dwte = to_device<T>(dwte);
    embedding_backward(dwte.data(), nullptr, p.dout.data(), p.tokens.data(), s.B, s.T, s.C);
    gpu::embedding_backward<T>(d_dwte.data(), nullptr, p.d_dout.data(), p.d_tokens.data(), s.B, s.T, s.C, env.ctx);
    EXPECT_TRUE(close(to_host(d_dwte), dwte, kTol<T>)) << "dwte";
  }
}

TYPED_TEST(EmbeddingGpuTest, BackwardIsDeterministic) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  // Three tokens over 1024 positions: long runs, where an order-dependent sum would show.
  for (const Shape& s : {Shape{4, 256, 72, 3}, Shape{4, 256, 7, 3}}) {
    SCOPED_TRACE(::testing::Message() << "C=" << s.C);
    const Problem<T> p(s);
    const std::vector<float> dwte0 = test::random_input<T>(int64_t{s.Vp} * s.C, 5);
    const std::vector<float> dwpe0 = test::random_input<T>(int64_t{s.T + 1} * s.C, 6);
    test::GpuEnv env(gpu::embedding_backward_scratch_bytes(s.B, s.T, s.C));
    std::vector<float> first_wte, first_wpe;
    for (int run = 0; run < 2; ++run) {
      DeviceBuffer<T> dwte = to_device<T>(dwte0), dwpe = to_device<T>(dwpe0);
      gpu::embedding_backward<T>(dwte.data(), dwpe.data(), p.d_dout.data(), p.d_tokens.data(), s.B, s.T, s.C, env.ctx);
      if (run == 0) {
        first_wte = to_host(dwte);
        first_wpe = to_host(dwpe);
      } else {
        EXPECT_TRUE(test::bitwise_equal(to_host(dwte), first_wte));
        EXPECT_TRUE(test::bitwise_equal(to_host(dwpe), first_wpe));
      }
    }
  }
}

TYPED_TEST(EmbeddingGpuTest, BackwardRejectsTooLittleScratch) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const Shape s{2, 3, 7, 5};
  const Problem<T> p(s);
  DeviceBuffer<T> dwte = to_device<T>(p.wte), dwpe = to_device<T>(p.wpe);
  test::GpuEnv env(gpu::embedding_backward_scratch_bytes(s.B, s.T, s.C) - 1);
  EXPECT_THROW(
      gpu::embedding_backward<T>(dwte.data(), dwpe.data(), p.d_dout.data(), p.d_tokens.data(), s.B, s.T, s.C, env.ctx),
      Error);
}

}  // namespace
}  // namespace st
