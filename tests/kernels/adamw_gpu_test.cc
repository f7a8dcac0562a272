// gpu::adamw_update against the CPU reference st::adamw_update.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/kernels/adamw.h"
#include "shardtrain/kernels/gpu/adamw.h"

namespace st {
namespace {

using test::close;
using test::kTol;
using test::to_device;
using test::to_host;

// The fp32 state follows the reference's arithmetic step for step (no FMA); 1e-6 leaves room for nothing
// but a compiler that still contracts.
constexpr double kStateTol = 1e-6;

// n elements starting `offset` into each buffer: offset 1 misaligns every pointer (scalar path); n % 4 != 0
// leaves a tail after the packs.
struct Shape {
  int64_t n;
  int offset;
};
const Shape kShapes[] = {{1, 0}, {7, 0}, {1000, 0}, {4099, 0}, {4099, 1}, {100003, 0}};

AdamWParams params() {
  AdamWParams p;
  p.lr = 1e-3f;
  p.weight_decay = 0.1f;
  p.step = 7;
  p.grad_scale = 0.8f;
  return p;
}

template <typename T>
class AdamWGpuTest : public ::testing::Test {};
TYPED_TEST_SUITE(AdamWGpuTest, test::ActivationTypes, test::ActivationNames);

TYPED_TEST(AdamWGpuTest, MatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const AdamWParams hp = params();
  for (const Shape& s : kShapes) {
    for (bool with_out : {true, false}) {
      SCOPED_TRACE(::testing::Message() << "n=" << s.n << " offset=" << s.offset << " param_out=" << with_out);
      std::vector<float> param = test::random_input<float>(s.n, 1);
      std::vector<float> m = test::random_input<float>(s.n, 2, 0.1f);
      std::vector<float> v = test::random_input<float>(s.n, 3, 0.1f);
      for (float& x : v) x *= x;  // v >= 0
      const std::vector<float> grad = test::random_input<float>(s.n, 4);
      test::GpuEnv env;
      DeviceBuffer<float> d_param = test::upload<float>(param, s.offset), d_m = test::upload<float>(m, s.offset);
      DeviceBuffer<float> d_v = test::upload<float>(v, s.offset), d_grad = test::upload<float>(grad, s.offset);
      DeviceBuffer<T> d_out(s.offset + s.n);
      test::poison(d_out);
      adamw_update(param.data(), m.data(), v.data(), grad.data(), s.n, hp);

      gpu::adamw_update<T>(d_param.data() + s.offset, d_m.data() + s.offset, d_v.data() + s.offset,
                           d_grad.data() + s.offset, s.n, hp, with_out ? d_out.data() + s.offset : nullptr, env.ctx);
      EXPECT_TRUE(close(test::download(d_param, s.offset), param, kStateTol)) << "param";
      EXPECT_TRUE(close(test::download(d_m, s.offset), m, kStateTol)) << "m";
      EXPECT_TRUE(close(test::download(d_v, s.offset), v, kStateTol)) << "v";
      if (with_out) {
        EXPECT_TRUE(close(test::download(d_out, s.offset), test::round_through<T>(param), kTol<T>)) << "param_out";
      } else {  // left alone: still the poison
        for (float x : test::download(d_out, s.offset)) ASSERT_TRUE(std::isnan(x));
      }
    }
  }
}

}  // namespace
}  // namespace st
