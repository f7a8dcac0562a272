// gpu::fill_uniform against its CPU reference st::fill_uniform, element by element: float bit for bit, bf16 and fp16
// equal to the reference rounded through the type. An odd length that no grid divides, and more elements than the
// grid's threads (the grid-stride loop).
#include <gtest/gtest.h>

#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/fill.h"
#include "shardtrain/kernels/gpu/fill.h"

namespace st {
namespace {

template <typename T>
class FillGpu : public ::testing::Test {};
TYPED_TEST_SUITE(FillGpu, test::ActivationTypes, test::ActivationNames);

TYPED_TEST(FillGpu, UniformMatchesCpuElementByElement) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{4096} * 256 + 77}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    std::vector<float> want(static_cast<size_t>(n));
    fill_uniform(want.data(), n, 0x5eed);
    test::GpuEnv env;
    DeviceBuffer<T> got(n);
    gpu::fill_uniform(got.data(), n, 0x5eed, env.ctx);
    EXPECT_TRUE(test::bitwise_equal(test::to_host(got), test::round_through<T>(want)));
  }
}

}  // namespace
}  // namespace st
