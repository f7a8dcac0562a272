// gpu::fp8_quantize_matrix against its CPU reference (kernels/fp8.h), byte for byte: the codes and the inverse scales
// of tensorwise, per-row and per-column scaling, with and without power-of-two scales, in E4M3 and E5M2, from float and
// from bf16 elements (bf16 as its float value), on random matrices of odd shapes and on ones with an all-zero row,
// float subnormals and magnitudes far apart; the first non-finite element is refused with the CPU's error.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "../common/caught.h"
#include "gpu_kernel_test.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/fp8.h"
#include "shardtrain/kernels/gpu/fp8.h"

namespace st {
namespace {

constexpr Fp8Format kFormats[] = {Fp8Format::kE4M3, Fp8Format::kE5M2};
constexpr Fp8Scaling kScalings[] = {Fp8Scaling::kTensor, Fp8Scaling::kRow, Fp8Scaling::kColumn};

struct Casted {
  std::vector<uint8_t> q;
  std::vector<float> inverse;
};

Casted cpu_cast(const std::vector<float>& x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling s, bool p2) {
  Casted c{std::vector<uint8_t>(x.size(), 0xab), std::vector<float>(static_cast<size_t>(fp8_groups(s, rows, cols)))};
  fp8_quantize_matrix(x.data(), rows, cols, f, s, p2, c.q.data(), c.inverse.data(), "x");
  return c;
}

template <typename T>
Casted gpu_cast(const std::vector<float>& x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling s, bool p2) {
  const int64_t groups = fp8_groups(s, rows, cols);
  const DeviceBuffer<T> dx = test::to_device<T>(x);
  DeviceBuffer<uint8_t> q(static_cast<int64_t>(x.size()));
  DeviceBuffer<float> inverse(groups);
  test::poison(q);
  test::GpuEnv env(gpu::fp8_quantize_scratch_bytes(groups));
  gpu::fp8_quantize_matrix<T>(dx.data(), rows, cols, f, s, p2, q.data(), inverse.data(), "x", env.ctx);
  Casted c{std::vector<uint8_t>(x.size()), std::vector<float>(static_cast<size_t>(groups))};
  ST_CUDA_CHECK(cudaMemcpy(c.q.data(), q.data(), q.bytes(), cudaMemcpyDeviceToHost));
  ST_CUDA_CHECK(cudaMemcpy(c.inverse.data(), inverse.data(), inverse.bytes(), cudaMemcpyDeviceToHost));
  return c;
}

::testing::AssertionResult same(const Casted& got, const Casted& want) {
  for (size_t g = 0; g < want.inverse.size(); ++g)
    if (std::memcmp(&got.inverse[g], &want.inverse[g], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "inverse scale " << g << ": " << got.inverse[g] << " != " << want.inverse[g];
  for (size_t i = 0; i < want.q.size(); ++i)
    if (got.q[i] != want.q[i])
      return ::testing::AssertionFailure() << "code " << i << ": " << int{got.q[i]} << " != " << int{want.q[i]};
  return ::testing::AssertionSuccess();
}

// Matrices that reach the casts' corners: an all-zero row (its scale from the 1e-12 floor), float subnormals, rows
// six orders of magnitude apart, a huge element.
std::vector<float> adversarial(int64_t rows, int64_t cols) {
  std::vector<float> x = test::random_input<float>(rows * cols, 9);
  for (int64_t c = 0; c < cols; ++c) {
    x[static_cast<size_t>(c)] = 0.0f;                          // row 0
    x[static_cast<size_t>(cols + c)] *= 1e-40f;                // row 1: float subnormals
    x[static_cast<size_t>(2 * cols + c)] *= 1e-6f;             // row 2
  }
  x[static_cast<size_t>(3 * cols + 1)] = 3e38f;
  return x;
}

TEST(Fp8Gpu, CastsEqualTheCpusCodesAndScales) {
  ST_SKIP_WITHOUT_GPU();
  for (const auto& [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {7, 33}, {64, 48}, {513, 257}})
    for (Fp8Format f : kFormats)
      for (Fp8Scaling s : kScalings)
        for (bool p2 : {false, true}) {
          SCOPED_TRACE(::testing::Message() << rows << "x" << cols << " " << to_string(f) << " scaling "
                                            << static_cast<int>(s) << (p2 ? " pow2" : ""));
          const std::vector<float> x = test::random_input<float>(rows * cols, static_cast<uint64_t>(rows + cols), 3.0f);
          EXPECT_TRUE(same(gpu_cast<float>(x, rows, cols, f, s, p2), cpu_cast(x, rows, cols, f, s, p2)));
          const std::vector<float> h = test::random_input<bf16>(rows * cols, static_cast<uint64_t>(rows * cols), 0.5f);
          EXPECT_TRUE(same(gpu_cast<bf16>(h, rows, cols, f, s, p2), cpu_cast(h, rows, cols, f, s, p2)));
          if (rows >= 4) {
            const std::vector<float> a = adversarial(rows, cols);
            EXPECT_TRUE(same(gpu_cast<float>(a, rows, cols, f, s, p2), cpu_cast(a, rows, cols, f, s, p2)));
          }
        }
}

TEST(Fp8Gpu, TheFirstNonFiniteElementIsRefusedAsTheCpuRefusesIt) {
  ST_SKIP_WITHOUT_GPU();
  std::vector<float> x = test::random_input<float>(40 * 16, 3);
  x[300] = NAN;
  x[77] = -INFINITY;
  std::vector<uint8_t> q(x.size());
  std::vector<float> inv(1);
  const Error want = testing::caught([&] {
    fp8_quantize_matrix(x.data(), 40, 16, Fp8Format::kE4M3, Fp8Scaling::kTensor, false, q.data(), inv.data(), "x");
  });
  const DeviceBuffer<float> dx = test::to_device<float>(x);
  DeviceBuffer<uint8_t> dq(static_cast<int64_t>(x.size()));
  DeviceBuffer<float> dinv(1);
  test::GpuEnv env(gpu::fp8_quantize_scratch_bytes(1));
  const Error got = testing::caught([&] {
    gpu::fp8_quantize_matrix<float>(dx.data(), 40, 16, Fp8Format::kE4M3, Fp8Scaling::kTensor, false, dq.data(),
                                    dinv.data(), "x", env.ctx);
  });
  EXPECT_EQ(got.kind(), ErrorKind::kBadInput);
  EXPECT_EQ(std::string(got.what()), std::string(want.what()));
  EXPECT_NE(std::string(got.what()).find("x: element 77 is -inf"), std::string::npos) << got.what();
}

}  // namespace
}  // namespace st
