// gpu::ColumnSums: bias and LayerNorm parameter gradients whose column sums are queued (GpuContext::column_sums) and
// finished in one launch give the same bits as the immediate path, which the matmul and LayerNorm GPU tests compare
// with the CPU reference. Float, bf16 and fp16; written and accumulated gradients.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/gpu/column_sums.h"
#include "shardtrain/kernels/gpu/layernorm.h"
#include "shardtrain/kernels/gpu/matmul.h"

namespace st {
namespace {

using test::random_input;
using test::to_device;
using test::to_host;

template <typename T>
class ColumnSumsGpu : public ::testing::Test {};
TYPED_TEST_SUITE(ColumnSumsGpu, test::ActivationTypes, test::ActivationNames);

// One block backward's worth of sums, the way CudaGpt::block_backward queues them: two biases (one packed, one of
// odd width: scalar loads), a LayerNorm's weight and bias, then a bias of another width, so the finish has five
// jobs of three widths. Rows: several chunks of both kernels, and an odd count.
template <typename T>
struct Sums {
  static constexpr int64_t N = 4099;
  static constexpr int C = 64, OC1 = 200, OC2 = 75, OC3 = 192;
  std::vector<float> x = random_input<T>(N * C, 1), w_ln = random_input<T>(C, 2), dout_ln = random_input<T>(N * C, 3);
  std::vector<float> d1 = random_input<T>(N * OC1, 4), d2 = random_input<T>(N * OC2, 5),
                     d3 = random_input<T>(N * OC3, 6);
  std::vector<float> mean = random_input<float>(N, 7), rstd = random_input<float>(N, 8, 0.25f, 1.0f);
  // Starting values of the outputs (what kAccumulate adds to).
  std::vector<float> b1 = random_input<T>(OC1, 9), b2 = random_input<T>(OC2, 10), b3 = random_input<T>(OC3, 11);
  std::vector<float> lw = random_input<T>(C, 12), lb = random_input<T>(C, 13);
  std::vector<float> dinp0 = random_input<T>(N * C, 14);  // layernorm_backward adds to dinp

  // {db1, db2, ln dweight, ln dbias, db3, ln dinp}, with the context's column_sums as given (finished at the end).
  std::vector<std::vector<float>> run(gpu::GpuContext ctx, GradWrite write) const {
    auto dx = to_device<T>(x), dw = to_device<T>(w_ln), dl = to_device<T>(dout_ln), o1 = to_device<T>(d1),
         o2 = to_device<T>(d2), o3 = to_device<T>(d3);
    auto m = to_device<float>(mean), r = to_device<float>(rstd);
    auto g1 = to_device<T>(b1), g2 = to_device<T>(b2), g3 = to_device<T>(b3), gw = to_device<T>(lw),
         gb = to_device<T>(lb);
    DeviceBuffer<T> weight_grads(int64_t{OC1} * C);
    auto dinp = to_device<T>(dinp0);
    gpu::matmul_backward<T>(nullptr, weight_grads.data(), g1.data(), o1.data(), dx.data(), nullptr, N, C, OC1, ctx,
                            GradWrite::kOverwrite, write);
    gpu::matmul_backward<T>(nullptr, weight_grads.data(), g2.data(), o2.data(), dx.data(), nullptr, N, C, OC2, ctx,
                            GradWrite::kOverwrite, write);
    gpu::layernorm_backward<T>(dinp.data(), gw.data(), gb.data(), dl.data(), dx.data(), dw.data(), m.data(), r.data(),
                               N, C, ctx, write);
    gpu::matmul_backward<T>(nullptr, weight_grads.data(), g3.data(), o3.data(), dx.data(), nullptr, N, C, OC3, ctx,
                            GradWrite::kOverwrite, write);
    if (ctx.column_sums) ctx.column_sums->finish(ctx.stream);
    return {to_host(g1), to_host(g2), to_host(gw), to_host(gb), to_host(g3), to_host(dinp)};
  }

  static size_t deferred_bytes() {
    size_t b = gpu::ColumnSums::reserved_bytes(gpu::layernorm_backward_scratch_bytes(N, C) / sizeof(float));
    for (int oc : {OC1, OC2, OC3}) b += gpu::ColumnSums::reserved_bytes(gpu::matmul_backward_scratch_bytes(N, oc) / 4);
    return b;
  }
};

TYPED_TEST(ColumnSumsGpu, QueuedFinishMatchesImmediateBitForBit) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const Sums<T> sums;
  gpu::Blas blas;
  const size_t scratch_bytes = std::max(gpu::layernorm_backward_scratch_bytes(Sums<T>::N, Sums<T>::C),
                                        gpu::matmul_backward_scratch_bytes(Sums<T>::N, Sums<T>::OC1));
  DeviceBuffer<char> scratch(static_cast<int64_t>(scratch_bytes));
  test::poison(scratch);
  const gpu::GpuContext immediate{nullptr, &blas, scratch.data(), scratch_bytes};
  // Exactly the room the queued partials need, and no scratch: the deferred path must not touch it.
  gpu::ColumnSums queue(Sums<T>::deferred_bytes());
  gpu::GpuContext deferred{nullptr, &blas, nullptr, 0};
  deferred.column_sums = &queue;
  const char* names[] = {"bias 200", "bias 75", "LayerNorm weight", "LayerNorm bias", "bias 192", "LayerNorm dinp"};
  for (GradWrite write : {GradWrite::kOverwrite, GradWrite::kAccumulate}) {
    const auto want = sums.run(immediate, write), got = sums.run(deferred, write);
    ASSERT_TRUE(queue.empty());
    for (size_t i = 0; i < want.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << names[i] << (write == GradWrite::kAccumulate ? ", accumulated" : ""));
      EXPECT_TRUE(test::bitwise_equal(got[i], want[i]));
    }
    // A wrong finish (a chunk dropped, a job's columns cut short) would change values, not only bits: the sums are
    // not all zero.
    EXPECT_NE(want[0][0], 0.0f);
  }
}

}  // namespace
}  // namespace st
