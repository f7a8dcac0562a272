// The kernels of a captured decoding step on the GPU (embedding_forward_at, rope_forward_at, kv_append_at,
// rope_kv_append_at, decode_attention_at, argmax_rows; float, bf16, fp16) against their CPU references on the same
// T-rounded operands: positions read from device memory, several sequences at once each with its own cache and
// position, and the greedy choice with ties, padding columns and non-finite rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gpu_kernel_test.h"
#include "rope_table_shape.h"
#include "shardtrain/core/config.h"
#include "shardtrain/kernels/argmax.h"
#include "shardtrain/kernels/decode_attention.h"
#include "shardtrain/kernels/embedding.h"
#include "shardtrain/kernels/gpu/argmax.h"
#include "shardtrain/kernels/gpu/decode_attention.h"
#include "shardtrain/kernels/gpu/embedding.h"
#include "shardtrain/kernels/gpu/rope.h"
#include "shardtrain/kernels/rope.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st {
namespace {

using test::kTol;

template <typename T>
class DecodeStepGpu : public ::testing::Test {};
TYPED_TEST_SUITE(DecodeStepGpu, test::ActivationTypes, test::ActivationNames);

const std::vector<int32_t> kPositions = {37, 0, 199, 64};  // four sequences, caches of 200 positions

TYPED_TEST(DecodeStepGpu, EmbeddingAndRopeAtPositionsMatchTheCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  test::GpuEnv env;
  const int V = 50, C = 64, L = 200, rows = 4, NH = 4, NKV = 2, hs = 16;
  const std::vector<float> wte = test::random_input<T>(V * C, 3100), wpe = test::random_input<T>(L * C, 3101);
  const std::vector<int32_t> tokens = {7, 49, 0, 7};
  std::vector<float> want(rows * C);
  embedding_forward_at(want.data(), tokens.data(), wte.data(), wpe.data(), kPositions.data(), rows, C);
  const DeviceBuffer<int32_t> dev_tokens = test::ints_to_device(tokens), dev_pos = test::ints_to_device(kPositions);
  const DeviceBuffer<T> dev_wte = test::to_device<T>(wte), dev_wpe = test::to_device<T>(wpe);
  DeviceBuffer<T> out(rows * C);
  gpu::embedding_forward_at<T>(out.data(), dev_tokens.data(), dev_wte.data(), dev_wpe.data(), dev_pos.data(), rows, C,
                               env.ctx);
  EXPECT_TRUE(test::bitwise_equal(test::to_host(out), test::round_through<T>(want)))
      << "a sum of two T values, rounded";

  const RopeTable table = test::llama_rope_table(NH, NKV, hs, L);
  const int64_t width = int64_t{NH + 2 * NKV} * hs;
  const std::vector<float> qkv = test::random_input<T>(rows * width, 3102);
  std::vector<float> turned = qkv;
  rope_forward_at(turned.data(), table.cos.data(), table.sin.data(), kPositions.data(), rows, NH, NKV, hs);
  DeviceBuffer<T> dev_qkv = test::to_device<T>(qkv);
  const DeviceBuffer<float> cos = test::to_device<float>(table.cos), sin = test::to_device<float>(table.sin);
  gpu::rope_forward_at<T>(dev_qkv.data(), cos.data(), sin.data(), dev_pos.data(), rows, NH, NKV, hs, env.ctx);
  EXPECT_TRUE(test::close(test::to_host(dev_qkv), turned, kTol<T>));
}

// 1 and 4 rows take the split-K path (splits of 64 keys over caches of 200: an idle row, one inside the first split, on
// a split's last key and at the cache's end), merged by a second kernel or by each (row, head)'s last split, 6 rows
// one block per (row, head); reruns are bit-identical.
TYPED_TEST(DecodeStepGpu, AppendAndAttendAtEachSequencesPositionMatchTheCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const std::vector<int32_t> positions = {37, -1, 199, 63, 130, 0};  // -1: an idle row
  for (const auto& [NH, NKV, hs] : {std::tuple{8, 2, 64}, std::tuple{4, 4, 40}, std::tuple{2, 1, 128}}) {
    for (int rows : {1, 4, 6}) {
      SCOPED_TRACE(::testing::Message() << "NH " << NH << " NKV " << NKV << " hs " << hs << " rows " << rows);
      const int L = 200;
      test::GpuEnv env(gpu::decode_attention_at_scratch_bytes(rows, NH, hs, L));
      const int64_t q_width = int64_t{NH} * hs, kv = int64_t{NKV} * hs, width = q_width + 2 * kv, seq_stride = L * kv;
      std::vector<float> k = test::random_input<T>(rows * seq_stride, 3200),
                         v = test::random_input<T>(rows * seq_stride, 3201);
      const std::vector<float> qkv = test::random_input<T>(rows * width, 3202);
      DeviceBuffer<T> dk = test::to_device<T>(k), dv = test::to_device<T>(v);
      const DeviceBuffer<T> dqkv = test::to_device<T>(qkv);
      const DeviceBuffer<int32_t> dev_pos = test::ints_to_device(positions);
      kv_append_at(k.data(), v.data(), qkv.data(), seq_stride, positions.data(), rows, NH, NKV, hs);
      gpu::kv_append_at<T>(dk.data(), dv.data(), dqkv.data(), seq_stride, dev_pos.data(), rows, NH, NKV, hs, env.ctx);
      EXPECT_TRUE(test::bitwise_equal(test::to_host(dk), k));
      EXPECT_TRUE(test::bitwise_equal(test::to_host(dv), v));
      std::vector<float> want(static_cast<size_t>(rows * q_width));
      decode_attention_at(want.data(), qkv.data(), width, k.data(), v.data(), seq_stride, positions.data(), rows, NH,
                          NKV, hs, L);
      std::vector<float> runs[2];
      for (std::vector<float>& got : runs) {
        DeviceBuffer<T> out(rows * q_width);
        test::poison(out);
        gpu::decode_attention_at<T>(out.data(), dqkv.data(), width, dk.data(), dv.data(), seq_stride, dev_pos.data(),
                                    rows, NH, NKV, hs, L, env.ctx);
        got = test::to_host(out);
      }
      EXPECT_TRUE(test::close(runs[0], want, kTol<T>));
      EXPECT_TRUE(test::bitwise_equal(runs[0], runs[1]));
      if (rows > gpu::kDecodeSplitMaxRows) continue;
      // The splits merged by the last of each (row, head) to finish: the two kernels' bits, twice over the same
      // counters, which each call leaves at zero.
      DeviceBuffer<unsigned> arrivals(rows * NH);
      ST_CUDA_CHECK(cudaMemset(arrivals.data(), 0, arrivals.bytes()));
      for (int run = 0; run < 2; ++run) {
        DeviceBuffer<T> out(rows * q_width);
        test::poison(out);
        ST_CUDA_CHECK(cudaDeviceSynchronize());  // the memsets before the context's stream runs
        gpu::decode_attention_at<T>(out.data(), dqkv.data(), width, dk.data(), dv.data(), seq_stride, dev_pos.data(),
                                    rows, NH, NKV, hs, L, env.ctx, arrivals.data());
        EXPECT_TRUE(test::bitwise_equal(test::to_host(out), runs[0])) << "run " << run;
        std::vector<unsigned> left(static_cast<size_t>(rows * NH));
        ST_CUDA_CHECK(cudaMemcpy(left.data(), arrivals.data(), arrivals.bytes(), cudaMemcpyDeviceToHost));
        EXPECT_EQ(left, std::vector<unsigned>(left.size(), 0u)) << "run " << run;
      }
    }
  }
}

// The fused turn and append against the CPU's rope_forward_at + kv_append_at, and bit for bit against the GPU's two
// kernels: packed (hs / 2 a multiple of the pack) and scalar head sizes, an idle row.
TYPED_TEST(DecodeStepGpu, RopeAppendMatchesTheCpuAndTheTwoKernels) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const std::vector<int32_t> positions = {37, -1, 199, 63};
  const int rows = 4, L = 200;
  for (const auto& [NH, NKV, hs] : {std::tuple{8, 2, 64}, std::tuple{4, 4, 40}, std::tuple{2, 1, 12}}) {
    SCOPED_TRACE(::testing::Message() << "NH " << NH << " NKV " << NKV << " hs " << hs);
    test::GpuEnv env;
    const RopeTable table = test::llama_rope_table(NH, NKV, hs, L);
    const int64_t kv = int64_t{NKV} * hs, width = int64_t{NH} * hs + 2 * kv, seq_stride = L * kv;
    std::vector<float> qkv = test::random_input<T>(rows * width, 3400),
                       k = test::random_input<T>(rows * seq_stride, 3401),
                       v = test::random_input<T>(rows * seq_stride, 3402);
    const DeviceBuffer<float> cos = test::to_device<float>(table.cos), sin = test::to_device<float>(table.sin);
    const DeviceBuffer<int32_t> dev_pos = test::ints_to_device(positions);
    DeviceBuffer<T> fused_qkv = test::to_device<T>(qkv), fused_k = test::to_device<T>(k),
                    fused_v = test::to_device<T>(v);
    DeviceBuffer<T> two_qkv = test::to_device<T>(qkv), two_k = test::to_device<T>(k), two_v = test::to_device<T>(v);
    gpu::rope_kv_append_at<T>(fused_qkv.data(), fused_k.data(), fused_v.data(), cos.data(), sin.data(), seq_stride,
                              dev_pos.data(), rows, NH, NKV, hs, env.ctx);
    gpu::rope_forward_at<T>(two_qkv.data(), cos.data(), sin.data(), dev_pos.data(), rows, NH, NKV, hs, env.ctx);
    gpu::kv_append_at<T>(two_k.data(), two_v.data(), two_qkv.data(), seq_stride, dev_pos.data(), rows, NH, NKV, hs,
                         env.ctx);
    rope_kv_append_at(qkv.data(), k.data(), v.data(), table.cos.data(), table.sin.data(), seq_stride, positions.data(),
                      rows, NH, NKV, hs);
    const std::vector<float> got_qkv = test::to_host(fused_qkv), got_k = test::to_host(fused_k),
                             got_v = test::to_host(fused_v);
    EXPECT_TRUE(test::close(got_qkv, qkv, kTol<T>));
    EXPECT_TRUE(test::close(got_k, k, kTol<T>));
    EXPECT_TRUE(test::bitwise_equal(got_v, v)) << "values are copied";
    EXPECT_TRUE(test::bitwise_equal(got_qkv, test::to_host(two_qkv)));
    EXPECT_TRUE(test::bitwise_equal(got_k, test::to_host(two_k)));
    EXPECT_TRUE(test::bitwise_equal(got_v, test::to_host(two_v)));
  }
}

// RoPE, the append and the attention of a step's rows in one call against rope_kv_append_at then decode_attention_at:
// the same output and caches, bit for bit (and, in fp32, the CPU's rope_append_attend_at). One row with a shared cache
// (a prompt's last token) or its own, four rows with a cache each (one idle, one on a split's last key, one at the
// cache's end), merged in the kernel or by a second one: the one-kernel path; two rows sharing a cache and six rows:
// the two calls. Packed and scalar head sizes, grouped key/value heads.
TYPED_TEST(DecodeStepGpu, RopeAppendAttendGivesTheBitsOfTheTwoCalls) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const std::vector<int32_t> positions = {37, -1, 199, 63, 130, 0};
  const int L = 200;
  for (const auto& [NH, NKV, hs] : {std::tuple{8, 2, 64}, std::tuple{4, 4, 40}, std::tuple{2, 1, 12}}) {
    for (const auto& [rows, shared, merged] :
         {std::tuple{1, true, true}, std::tuple{1, false, false}, std::tuple{4, false, true},
          std::tuple{4, false, false}, std::tuple{2, true, true}, std::tuple{6, false, true}}) {
      SCOPED_TRACE(::testing::Message() << "NH " << NH << " NKV " << NKV << " hs " << hs << " rows " << rows
                                        << (shared ? " sharing a cache" : "")
                                        << (merged ? ", merged in the kernel" : ", merged by a second kernel"));
      test::GpuEnv env(gpu::decode_attention_at_scratch_bytes(rows, NH, hs, L));
      const RopeTable table = test::llama_rope_table(NH, NKV, hs, L);
      const int64_t q_width = int64_t{NH} * hs, kv = int64_t{NKV} * hs, width = q_width + 2 * kv;
      const int64_t seq_stride = shared ? 0 : L * kv, cache = (shared ? 1 : rows) * L * kv;
      // A shared cache's rows are one sequence's consecutive positions.
      std::vector<int32_t> pos(static_cast<size_t>(rows));
      for (int r = 0; r < rows; ++r) pos[static_cast<size_t>(r)] = shared ? 120 + r : positions[static_cast<size_t>(r)];
      const std::vector<float> qkv = test::random_input<T>(rows * width, 3500), k = test::random_input<T>(cache, 3501),
                               v = test::random_input<T>(cache, 3502);
      const DeviceBuffer<float> cos = test::to_device<float>(table.cos), sin = test::to_device<float>(table.sin);
      const DeviceBuffer<int32_t> dev_pos = test::ints_to_device(pos);
      DeviceBuffer<T> one_qkv = test::to_device<T>(qkv), one_k = test::to_device<T>(k), one_v = test::to_device<T>(v);
      DeviceBuffer<T> two_qkv = test::to_device<T>(qkv), two_k = test::to_device<T>(k), two_v = test::to_device<T>(v);
      DeviceBuffer<T> one(rows * q_width), two(rows * q_width);
      test::poison(one);
      test::poison(two);
      DeviceBuffer<unsigned> arrivals(std::max(rows, gpu::kDecodeSplitMaxRows) * NH);
      ST_CUDA_CHECK(cudaMemset(arrivals.data(), 0, arrivals.bytes()));
      ST_CUDA_CHECK(cudaDeviceSynchronize());  // the memsets before the context's stream runs
      gpu::rope_append_attend_at<T>(one.data(), one_qkv.data(), one_k.data(), one_v.data(), cos.data(), sin.data(),
                                    seq_stride, dev_pos.data(), rows, NH, NKV, hs, L, env.ctx,
                                    merged ? arrivals.data() : nullptr);
      gpu::rope_kv_append_at<T>(two_qkv.data(), two_k.data(), two_v.data(), cos.data(), sin.data(), seq_stride,
                                dev_pos.data(), rows, NH, NKV, hs, env.ctx);
      gpu::decode_attention_at<T>(two.data(), two_qkv.data(), width, two_k.data(), two_v.data(), seq_stride,
                                  dev_pos.data(), rows, NH, NKV, hs, L, env.ctx);
      const std::vector<float> got = test::to_host(one), got_k = test::to_host(one_k);
      if constexpr (std::is_same_v<T, float>) {
        // The CPU reference (in 16 bits the GPU rounds the turned heads to T before attending, the CPU does not: the
        // two calls' bits, which the tests above hold against the CPU, are the bar there).
        std::vector<float> cpu_qkv = qkv, cpu_k = k, cpu_v = v, want(static_cast<size_t>(rows * q_width));
        rope_append_attend_at(want.data(), cpu_qkv.data(), cpu_k.data(), cpu_v.data(), table.cos.data(),
                              table.sin.data(), seq_stride, pos.data(), rows, NH, NKV, hs, L);
        EXPECT_TRUE(test::close(got, want, kTol<T>));
        EXPECT_TRUE(test::close(got_k, cpu_k, kTol<T>));
        EXPECT_TRUE(test::bitwise_equal(test::to_host(one_v), cpu_v)) << "values are copied";
      }
      EXPECT_TRUE(test::bitwise_equal(got, test::to_host(two)));
      EXPECT_TRUE(test::bitwise_equal(got_k, test::to_host(two_k)));
      EXPECT_TRUE(test::bitwise_equal(test::to_host(one_v), test::to_host(two_v)));
      std::vector<unsigned> left(static_cast<size_t>(arrivals.size()));
      ST_CUDA_CHECK(cudaMemcpy(left.data(), arrivals.data(), arrivals.bytes(), cudaMemcpyDeviceToHost));
      EXPECT_TRUE(std::all_of(left.begin(), left.end(), [](unsigned c) { return c == 0; })) << "counters left";
    }
  }
}

// gpu::argmax_rows's tokens for `logits` [rows, ld] (V of each row the vocabulary), and the CPU's.
template <typename T>
void expect_argmax_of_the_cpu(const std::vector<float>& logits, int64_t ld, int rows, int V) {
  test::GpuEnv env(gpu::argmax_rows_scratch_bytes(rows, V));
  std::vector<int32_t> want(rows);
  argmax_rows(logits.data(), ld, rows, V, want.data());
  const DeviceBuffer<T> dev = test::to_device<T>(logits);
  DeviceBuffer<int32_t> tokens(rows);
  gpu::argmax_rows<T>(dev.data(), ld, rows, V, tokens.data(), env.ctx);
  env.stream.synchronize();  // the copy below runs on another stream
  std::vector<int32_t> got(rows);
  ST_CUDA_CHECK(cudaMemcpy(got.data(), tokens.data(), tokens.bytes(), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, want);
}

TYPED_TEST(DecodeStepGpu, ArgmaxMatchesTheCpu) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  const int V = 50257, rows = 5;
  // Rows padded to 16-byte packs, and rows of V (odd: every row but the first misaligned, read a logit at a time).
  for (const int ld : {50304, V}) {
    SCOPED_TRACE(ld);
    std::vector<float> logits = test::random_input<T>(int64_t{rows} * ld, 3300);
    if (ld > V)
      for (int r = 0; r < rows; ++r) logits[static_cast<size_t>(r * ld + V + 3)] = 100.0f;  // padding, not vocabulary
    logits[static_cast<size_t>(1 * ld + 17)] = logits[static_cast<size_t>(1 * ld + 40000)] = 50.0f;  // a tie: 17
    logits[static_cast<size_t>(2 * ld + V - 1)] = 60.0f;  // the last id, in the last (partial) chunk
    logits[static_cast<size_t>(3 * ld + 123)] = std::numeric_limits<float>::quiet_NaN();
    logits[static_cast<size_t>(4 * ld + 9)] = -std::numeric_limits<float>::infinity();
    std::vector<int32_t> want(rows);
    argmax_rows(logits.data(), ld, rows, V, want.data());
    EXPECT_EQ(want[1], 17);
    EXPECT_EQ(want[2], V - 1);
    EXPECT_EQ(want[3], -1);
    EXPECT_EQ(want[4], -1);
    expect_argmax_of_the_cpu<T>(logits, ld, rows, V);
  }
}

TYPED_TEST(DecodeStepGpu, ArgmaxOfSmallRowsAndTies) {
  ST_SKIP_WITHOUT_GPU();
  using T = TypeParam;
  // A vocabulary under one chunk, rows of whole packs; row 0: a tie inside a pack (ids 9 and 11); row 1: -0 before +0
  // as the largest (equal: the lower id); row 2: +0 before -0; row 3: every logit equal (id 0).
  const int V = 1000, ld = 1024, rows = 4;
  std::vector<float> logits = test::random_input<T>(int64_t{rows} * ld, 3301, 1.0f, -8.0f);  // below 0 (8 sigma)
  logits[9] = logits[11] = 4.0f;
  logits[static_cast<size_t>(ld + 300)] = -0.0f;
  logits[static_cast<size_t>(ld + 301)] = 0.0f;
  logits[static_cast<size_t>(2 * ld + 500)] = 0.0f;
  logits[static_cast<size_t>(2 * ld + 700)] = -0.0f;
  std::fill(logits.begin() + 3 * ld, logits.begin() + 4 * ld, 0.5f);
  std::vector<int32_t> want(rows);
  argmax_rows(logits.data(), ld, rows, V, want.data());
  EXPECT_EQ(want[0], 9);
  EXPECT_EQ(want[1], 300);
  EXPECT_EQ(want[2], 500);
  EXPECT_EQ(want[3], 0);
  expect_argmax_of_the_cpu<T>(logits, ld, rows, V);
}

}  // namespace
}  // namespace st
