// gpu::nf4_quantize and gpu::nf4_dequantize against their CPU references (kernels/nf4.h), byte for byte: the GPU's
// storage (offset, scales, codes, absmax codes: nf4_layout's one buffer) equals the CPU's on random normal tensors of
// odd sizes (a short last block, a short last group, a half-filled last code byte, several million weights) and on
// adversarial ones, from float and from bf16 weights; the first non-finite weight is refused with the CPU's error;
// dequantised floats equal the CPU's bit for bit, bf16 ones the CPU's rounded to nearest even, on the packed path
// and on the one-weight-at-a-time path that unaligned pointers take.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "../common/caught.h"
#include "gpu_kernel_test.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/gpu/nf4.h"
#include "shardtrain/kernels/nf4.h"

namespace st {
namespace {

constexpr int64_t kGroupWeights = kNf4BlockSize * kNf4AbsmaxGroupSize;
constexpr std::array<int64_t, 7> kSizes = {1, 63, 64, 65, kGroupWeights, kGroupWeights + 1, 3 * 1024 * 1024 + 7};

// Tensors that reach the quantiser's corners.
std::vector<std::pair<std::string, std::vector<float>>> adversarial_tensors() {
  std::vector<std::pair<std::string, std::vector<float>>> cases;
  std::vector<float> zero_blocks = ::st::testing::randn(64 * 300 + 5, 1);
  std::fill(zero_blocks.begin() + 64, zero_blocks.begin() + 192, 0.0f);  // two all-zero blocks
  std::fill(zero_blocks.end() - 5, zero_blocks.end(), -0.0f);            // a short last block of negative zeros
  cases.emplace_back("zero_blocks", zero_blocks);
  cases.emplace_back("all_zero", std::vector<float>(kGroupWeights + 1000, 0.0f));
  std::vector<float> huge = ::st::testing::randn(kGroupWeights * 2 + 77, 2);
  huge[100] = 3e38f;  // its block's other weights go to code 7; the offset and one group's scale follow it
  huge[kGroupWeights + 5] = -3.3e38f;  // near the largest bf16 too
  cases.emplace_back("huge", huge);
  cases.emplace_back("subnormal", ::st::testing::randn(64 * 10 + 3, 3, 1e-39f));  // absmaxes below FLT_MIN too
  std::vector<float> tiny_and_huge = ::st::testing::randn(kGroupWeights + 64 * 7, 4, 1e-41f);
  for (size_t i = 0; i < tiny_and_huge.size(); i += 64 * 17)
    tiny_and_huge[i] = 1e30f;  // centred absmaxes of both signs
  cases.emplace_back("tiny_and_huge", tiny_and_huge);
  // Every float32 midpoint between adjacent levels, and every level exactly, in blocks whose absmax is 1 or -1:
  // ties go to the lower level.
  std::vector<float> ties;
  for (int rep = 0; rep < 64; ++rep) {
    for (size_t k = 0; k + 1 < kNf4Levels.size(); ++k) ties.push_back(0.5f * (kNf4Levels[k] + kNf4Levels[k + 1]));
    for (float level : kNf4Levels) ties.push_back(rep % 2 == 0 ? level : -level);
  }
  for (size_t i = 0; i < ties.size(); i += 64) ties[i] = (i / 64) % 3 == 0 ? -1.0f : 1.0f;
  cases.emplace_back("midpoints_and_levels", ties);
  std::vector<float> equal(64 * 512);  // every absmax equal: every scale 0
  for (size_t i = 0; i < equal.size(); ++i) equal[i] = -1.0f + 2.0f * static_cast<float>(i % 64) / 63.0f;
  cases.emplace_back("equal_absmaxes", equal);
  return cases;
}

// The CPU's storage of x in nf4_layout's buffer (first filled with a byte the quantiser must overwrite).
std::vector<uint8_t> cpu_storage(const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> bytes(static_cast<size_t>(nf4_bytes(n)), 0xab);
  nf4_quantize(x.data(), n, nf4_view(bytes.data(), n), "w");
  return bytes;
}

std::vector<uint8_t> to_host_bytes(const DeviceBuffer<uint8_t>& d) {
  ST_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> bytes(d.bytes());
  ST_CUDA_CHECK(cudaMemcpy(bytes.data(), d.data(), d.bytes(), cudaMemcpyDeviceToHost));
  return bytes;
}

DeviceBuffer<uint8_t> to_device_bytes(const std::vector<uint8_t>& bytes) {
  DeviceBuffer<uint8_t> d(static_cast<int64_t>(bytes.size()));
  ST_CUDA_CHECK(cudaMemcpy(d.data(), bytes.data(), d.bytes(), cudaMemcpyHostToDevice));
  ST_CUDA_CHECK(cudaDeviceSynchronize());
  return d;
}

// The GPU's storage of x, quantised from T (x is T-exact), in a poisoned buffer.
template <typename T>
std::vector<uint8_t> gpu_storage(const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  const DeviceBuffer<T> dx = test::to_device<T>(x);
  DeviceBuffer<uint8_t> q(nf4_bytes(n));
  test::poison(q);
  test::GpuEnv env(gpu::nf4_quantize_scratch_bytes(n));
  gpu::nf4_quantize(dx.data(), n, nf4_view(q.data(), n), "w", env.ctx);
  return to_host_bytes(q);
}

// Equal storage of n weights, or the first difference by section and element.
::testing::AssertionResult same_storage(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, int64_t n) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " != " << want.size() << " bytes";
  const Nf4ConstView g = nf4_view(got.data(), n), w = nf4_view(want.data(), n);
  if (std::memcmp(g.absmax_offset, w.absmax_offset, sizeof(float)) != 0)
    return ::testing::AssertionFailure() << "offset " << *g.absmax_offset << " != " << *w.absmax_offset;
  for (int64_t k = 0; k < nf4_groups(n); ++k)
    if (std::memcmp(g.absmax_scales + k, w.absmax_scales + k, sizeof(float)) != 0)
      return ::testing::AssertionFailure()
             << "scale " << k << ": " << g.absmax_scales[k] << " != " << w.absmax_scales[k];
  for (int64_t k = 0; k < nf4_blocks(n); ++k)
    if (g.absmax_codes[k] != w.absmax_codes[k])
      return ::testing::AssertionFailure()
             << "absmax code " << k << ": " << int{g.absmax_codes[k]} << " != " << int{w.absmax_codes[k]};
  for (int64_t k = 0; k < (n + 1) / 2; ++k)
    if (g.codes[k] != w.codes[k])
      return ::testing::AssertionFailure() << "code byte " << k << " (weights " << 2 * k << ", " << 2 * k + 1
                                           << "): " << int{g.codes[k]} << " != " << int{w.codes[k]};
  if (got != want) return ::testing::AssertionFailure() << "the sections agree but the buffers differ";
  return ::testing::AssertionSuccess();
}

TEST(Nf4Gpu, QuantizeEqualsCpuOnNormalTensorsOfOddSizes) {
  ST_SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const std::vector<float> x = test::random_input<float>(n, static_cast<uint64_t>(n), 0.02f);
    EXPECT_TRUE(same_storage(gpu_storage<float>(x), cpu_storage(x), n));
  }
}

TEST(Nf4Gpu, QuantizeEqualsCpuOnAdversarialTensors) {
  ST_SKIP_WITHOUT_GPU();
  for (const auto& [name, x] : adversarial_tensors()) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(same_storage(gpu_storage<float>(x), cpu_storage(x), static_cast<int64_t>(x.size())));
  }
}

// A bf16 weight is quantised as the CPU quantises its float value.
TEST(Nf4Gpu, QuantizeBf16EqualsCpuOnTheFloatValues) {
  ST_SKIP_WITHOUT_GPU();
  for (int64_t n : kSizes) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    const std::vector<float> x = test::random_input<bf16>(n, static_cast<uint64_t>(n) + 100, 0.02f);
    EXPECT_TRUE(same_storage(gpu_storage<bf16>(x), cpu_storage(x), n));
  }
  for (const auto& [name, x] : adversarial_tensors()) {
    SCOPED_TRACE(name);
    const std::vector<float> rounded = test::round_through<bf16>(x);
    EXPECT_TRUE(same_storage(gpu_storage<bf16>(rounded), cpu_storage(rounded), static_cast<int64_t>(x.size())));
  }
}

TEST(Nf4Gpu, EmptyTensorWritesAZeroOffset) {
  ST_SKIP_WITHOUT_GPU();
  DeviceBuffer<uint8_t> q(nf4_bytes(0));
  test::poison(q);
  test::GpuEnv env;
  gpu::nf4_quantize(static_cast<const float*>(nullptr), 0, nf4_view(q.data(), 0), "w", env.ctx);
  EXPECT_TRUE(same_storage(to_host_bytes(q), cpu_storage({}), 0));
}

// The lowest non-finite index is named, in the CPU's words, wherever the others are (another warp, block or group).
TEST(Nf4Gpu, FirstNonFiniteWeightIsRefusedAsTheCpuRefusesIt) {
  ST_SKIP_WITHOUT_GPU();
  const int64_t n = 3 * kGroupWeights + 5;
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (const std::vector<int64_t>& at : {std::vector<int64_t>{130}, std::vector<int64_t>{kGroupWeights + 33, 7},
                                           std::vector<int64_t>{n - 1, 2 * kGroupWeights + 64}}) {
      std::vector<float> x = test::random_input<bf16>(n, 7);
      for (int64_t i : at) x[static_cast<size_t>(i)] = bad;
      const Error cpu = ::st::testing::caught([&] { cpu_storage(x); });
      SCOPED_TRACE(cpu.what());
      const Error f32 = ::st::testing::caught([&] { gpu_storage<float>(x); });
      const Error b16 = ::st::testing::caught([&] { gpu_storage<bf16>(x); });
      EXPECT_EQ(f32.kind(), ErrorKind::kBadInput);
      EXPECT_EQ(b16.kind(), ErrorKind::kBadInput);
      EXPECT_NE(std::string(cpu.what()).find("w: element " + std::to_string(*std::min_element(at.begin(), at.end()))),
                std::string::npos);
      EXPECT_STREQ(f32.what(), cpu.what());
      EXPECT_STREQ(b16.what(), cpu.what());
    }
  }
}

template <typename T>
class Nf4DequantizeGpu : public ::testing::Test {};
using DequantizeTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(Nf4DequantizeGpu, DequantizeTypes, test::ActivationNames);

// The CPU's dequantised values of x's CPU storage, rounded through T.
template <typename T>
std::vector<float> cpu_dequantized(const std::vector<uint8_t>& storage, int64_t n) {
  std::vector<float> want(static_cast<size_t>(n));
  nf4_dequantize(nf4_view(storage.data(), n), want.data());
  return test::round_through<T>(std::move(want));
}

// Which pointer the dequantisation gets one element past its alignment: either takes the one-weight-at-a-time path.
enum class Misaligned { kNone, kCodes, kOut };
constexpr std::array<Misaligned, 3> kAlignments = {Misaligned::kNone, Misaligned::kCodes, Misaligned::kOut};
const char* to_string(Misaligned m) {
  return m == Misaligned::kNone ? "aligned" : (m == Misaligned::kCodes ? "codes unaligned" : "out unaligned");
}

// The GPU's, from storage on the device; misaligned codes are a copy in a buffer of their own.
template <typename T>
std::vector<float> gpu_dequantized(const std::vector<uint8_t>& storage, int64_t n, Misaligned misaligned) {
  const DeviceBuffer<uint8_t> q = to_device_bytes(storage);
  Nf4ConstView view = nf4_view(q.data(), n);
  const int shift = misaligned == Misaligned::kOut ? 1 : 0;
  DeviceBuffer<uint8_t> codes((n + 1) / 2 + 1);
  if (misaligned == Misaligned::kCodes) {
    ST_CUDA_CHECK(cudaMemcpy(codes.data() + 1, view.codes, static_cast<size_t>((n + 1) / 2), cudaMemcpyDeviceToDevice));
    ST_CUDA_CHECK(cudaDeviceSynchronize());  // the legacy stream's copy, before the test's non-blocking stream reads it
    view.codes = codes.data() + 1;
  }
  DeviceBuffer<T> out(n + shift);
  test::poison(out);
  test::GpuEnv env;
  gpu::nf4_dequantize(view, out.data() + shift, env.ctx);
  return test::download(out, shift);
}

TYPED_TEST(Nf4DequantizeGpu, EqualsCpuOnNormalTensorsOfOddSizes) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (Misaligned misaligned : kAlignments) {
    for (int64_t n : kSizes) {
      SCOPED_TRACE(::testing::Message() << "n=" << n << ", " << to_string(misaligned));
      const std::vector<uint8_t> storage = cpu_storage(test::random_input<float>(n, static_cast<uint64_t>(n), 0.02f));
      EXPECT_TRUE(test::bitwise_equal(gpu_dequantized<T>(storage, n, misaligned), cpu_dequantized<T>(storage, n)));
    }
  }
}

TYPED_TEST(Nf4DequantizeGpu, EqualsCpuOnAdversarialTensors) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  for (Misaligned misaligned : kAlignments) {
    for (const auto& [name, x] : adversarial_tensors()) {
      SCOPED_TRACE(name + ", " + to_string(misaligned));
      const auto n = static_cast<int64_t>(x.size());
      const std::vector<uint8_t> storage = cpu_storage(x);
      EXPECT_TRUE(test::bitwise_equal(gpu_dequantized<T>(storage, n, misaligned), cpu_dequantized<T>(storage, n)));
    }
  }
}

}  // namespace
}  // namespace st
