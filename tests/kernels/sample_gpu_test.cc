// gpu::sample_rows against the CPU reference sample_rows (kernels/sample.h) on the same T-rounded logits, token for
// token (float, bf16, fp16): vocabularies of 50257 and 128256 in padded rows, top_k 0, 1, 7, 50 and V at several
// temperatures and draw indices, with ties across the top_k boundary, -0 beside +0, a row of equal logits, a row of
// coarse values (ties everywhere) and rows holding a NaN or an infinity (-1). The draws are read from device memory
// when the kernels run: a captured graph replayed with new draws gives the new draws' tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "gpu_kernel_test.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/kernels/gpu/sample.h"
#include "shardtrain/kernels/sample.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st {
namespace {

template <typename T>
class SampleGpu : public ::testing::Test {};
TYPED_TEST_SUITE(SampleGpu, test::ActivationTypes, test::ActivationNames);

constexpr int kRows = 9;

// kRows rows of V logits (stride ld), representable in T: random normals with scale 3, but row 1 has four logits of
// 40 (the top ids 100, 2000, 40000 and V - 1) and eight of 30 (ids 5 .. 12), so that top 7 takes the first three of
// the 30s; row 2 is all 0.5; row 3 all negative but for -0 at ids 10 and 30 and +0 at 20; row 4 holds multiples of
// 0.25 in [-4, 4]; rows 5, 6 and 7 a NaN, +inf and -inf. The padding holds 1e4, which no token may be.
template <typename T>
std::vector<float> sample_logits(int V, int64_t ld) {
  std::vector<float> x = test::random_input<T>(kRows * ld, 3400, 3.0f);
  auto at = [&](int r, int64_t i) -> float& { return x[static_cast<size_t>(r * ld + i)]; };
  for (int r = 0; r < kRows; ++r)
    for (int64_t i = V; i < ld; ++i) at(r, i) = 1e4f;
  for (int64_t i : {int64_t{100}, int64_t{2000}, int64_t{40000}, int64_t{V - 1}}) at(1, i) = 40.0f;
  for (int64_t i = 5; i <= 12; ++i) at(1, i) = 30.0f;
  for (int64_t i = 0; i < V; ++i) at(2, i) = 0.5f;
  for (int64_t i = 0; i < V; ++i) at(3, i) = -std::fabs(at(3, i)) - 0.25f;
  at(3, 10) = at(3, 30) = -0.0f;
  at(3, 20) = 0.0f;
  for (int64_t i = 0; i < V; ++i) at(4, i) = std::round(at(4, i) * 4.0f) / 4.0f;
  at(5, 777) = std::numeric_limits<float>::quiet_NaN();
  at(6, V - 1) = std::numeric_limits<float>::infinity();
  at(7, 0) = -std::numeric_limits<float>::infinity();
  return test::round_through<T>(std::move(x));  // row 3's -|x| - 0.25 is not always representable in T
}

// Each row's draw index in round `round`: below 16 in round 0, below 4096 in round 1, and in round 2 near 2^64, where
// draw * V wraps.
std::vector<uint64_t> draw_indices(int round) {
  std::vector<uint64_t> d(kRows);
  for (int r = 0; r < kRows; ++r)
    d[static_cast<size_t>(r)] = round == 2
                                    ? ~uint64_t{0} - static_cast<uint64_t>(r)
                                    : random_bits_at(61, static_cast<uint64_t>(round), static_cast<uint64_t>(r)) %
                                          (uint64_t{1} << (8 * round + 4));
  return d;
}

void upload(DeviceBuffer<uint64_t>& d, const std::vector<uint64_t>& host) {
  ST_CUDA_CHECK(cudaMemcpy(d.data(), host.data(), d.bytes(), cudaMemcpyHostToDevice));
  ST_CUDA_CHECK(cudaDeviceSynchronize());  // see to_device in tests/common/gpu_test.h
}

TYPED_TEST(SampleGpu, TokensEqualTheCpuReference) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  // Rows 16-byte aligned (the top-k selection reads them in packs) and, with a stride of 50,261, not (one at a time).
  for (const auto& [V, ld] : {std::pair<int, int64_t>{50257, 50304}, std::pair<int, int64_t>{128256, 128384},
                              std::pair<int, int64_t>{50257, 50261}}) {
    const std::vector<float> logits = sample_logits<T>(V, ld);
    test::GpuEnv env(gpu::sample_rows_scratch_bytes(kRows, V));
    const DeviceBuffer<T> dev = test::to_device<T>(logits);
    DeviceBuffer<uint64_t> draws(kRows);
    DeviceBuffer<int32_t> tokens(kRows);
    for (const int64_t top_k : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{50}, int64_t{V}}) {
      for (const double temperature : {1.0, 0.6, 3.0}) {
        for (int round = 0; round < 3; ++round) {
          SCOPED_TRACE(::testing::Message()
                       << "V " << V << " top_k " << top_k << " temperature " << temperature << " round " << round);
          const SamplingOptions o{temperature, top_k, 1234};
          const std::vector<uint64_t> d = draw_indices(round);
          std::vector<int32_t> want(kRows);
          sample_rows(logits.data(), ld, kRows, V, d.data(), o, want.data());
          for (int r : {5, 6, 7}) EXPECT_EQ(want[static_cast<size_t>(r)], -1) << "row " << r;
          if (top_k == 1) {
            EXPECT_EQ(want[1], 100);
            EXPECT_EQ(want[2], 0);
            EXPECT_EQ(want[3], 10);
          } else if (top_k == 7) {
            EXPECT_TRUE((want[1] >= 5 && want[1] <= 7) || want[1] == 100 || want[1] == 2000 || want[1] == 40000 ||
                        want[1] == V - 1)
                << want[1];
            EXPECT_LT(want[2], 7);
          }
          upload(draws, d);
          ST_CUDA_CHECK(cudaMemset(tokens.data(), 0x7F, tokens.bytes()));  // no id, and not -1
          gpu::sample_rows<T>(dev.data(), ld, kRows, V, draws.data(), o, tokens.data(), env.ctx);
          EXPECT_EQ(test::ints_to_host(tokens), want);
        }
      }
    }
  }
}

// One capture, three replays with new draws in the same device buffer: each gives the CPU reference's tokens for
// its draws. A context without scratch is refused.
TYPED_TEST(SampleGpu, AGraphReplaysWithNewDraws) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const int V = 50257;
  const int64_t ld = 50304;
  const std::vector<float> logits = sample_logits<T>(V, ld);
  test::GpuEnv env(gpu::sample_rows_scratch_bytes(kRows, V));
  const DeviceBuffer<T> dev = test::to_device<T>(logits);
  DeviceBuffer<uint64_t> draws(kRows);
  DeviceBuffer<int32_t> tokens(kRows);
  const SamplingOptions o{0.9, 40, 77};
  cudaGraph_t graph = nullptr;
  ST_CUDA_CHECK(cudaStreamBeginCapture(env.stream.get(), cudaStreamCaptureModeThreadLocal));
  gpu::sample_rows<T>(dev.data(), ld, kRows, V, draws.data(), o, tokens.data(), env.ctx);
  ST_CUDA_CHECK(cudaStreamEndCapture(env.stream.get(), &graph));
  cudaGraphExec_t exec = nullptr;
  ST_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<int32_t> first;
  for (int round = 0; round < 3; ++round) {
    const std::vector<uint64_t> d = draw_indices(round);
    std::vector<int32_t> want(kRows);
    sample_rows(logits.data(), ld, kRows, V, d.data(), o, want.data());
    upload(draws, d);
    ST_CUDA_CHECK(cudaGraphLaunch(exec, env.stream.get()));
    env.stream.synchronize();
    const std::vector<int32_t> got = test::ints_to_host(tokens);
    EXPECT_EQ(got, want) << "round " << round;
    if (round == 0) first = got;
  }
  EXPECT_NE(test::ints_to_host(tokens), first);  // the rounds' draws gave other tokens
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  test::GpuEnv bare;
  EXPECT_THROW(gpu::sample_rows<T>(dev.data(), ld, kRows, V, draws.data(), o, tokens.data(), bare.ctx), Error);
}

}  // namespace
}  // namespace st
