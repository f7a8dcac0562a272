// st::gpu::decode_attention_at over one sequence (float, bf16, fp16) against the CPU reference st::decode_attention on
// the same T-rounded operands, element by element: multi-head and grouped-query attention (NH/NKV 4/4, 8/2, 14/2, 4/1),
// head sizes 64, 128 and 40 (no power of two), caches of 1, 63, 64, 65 and 200 positions (around the 64-key tile), one
// query (a decoding step) and several at once (a prompt's prefill, query i seeing pos + i + 1 keys), queries inside
// fused qkv rows; and reruns bit-identical.
#include <gtest/gtest.h>

#include <ostream>
#include <vector>

#include "attention_gpu_test.h"
#include "gpu_kernel_test.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/decode_attention.h"
#include "shardtrain/kernels/gpu/decode_attention.h"

namespace st {
namespace {

using test::bitwise_equal;
using test::matches;

// n queries at positions pos .. pos + n - 1 of NH heads of hs, NKV K/V heads; the cache holds pos + n positions.
struct Case {
  int NH, NKV, hs, n, pos;
  int64_t qkv_width() const { return int64_t{NH + 2 * NKV} * hs; }
  int64_t out_size() const { return int64_t{n} * NH * hs; }
  int64_t cache_size() const { return int64_t{pos + n} * NKV * hs; }
};

std::ostream& operator<<(std::ostream& os, const Case& c) {
  return os << "NH " << c.NH << " NKV " << c.NKV << " hs " << c.hs << " n " << c.n << " pos " << c.pos;
}

// max |got - want| <= tol * max |want|: an output is a probability-weighted mean of values, rounded to T once.
template <typename T>
inline constexpr double kTol = std::is_same_v<T, float> ? 1e-5 : 1e-2;

template <typename T>
struct Problem {
  std::vector<float> qkv, k, v, want;  // queries inside fused qkv rows [n, (NH + 2 NKV) hs]; caches; the CPU's out
  Problem(const Case& c, uint64_t stream)
      : qkv(test::random_input<T>(int64_t{c.n} * c.qkv_width(), stream)),
        k(test::random_input<T>(c.cache_size(), stream + 1)),
        v(test::random_input<T>(c.cache_size(), stream + 2)),
        want(static_cast<size_t>(c.out_size())) {
    decode_attention(want.data(), qkv.data(), c.qkv_width(), k.data(), v.data(), c.n, c.pos, c.NH, c.NKV, c.hs);
  }
};

// One sequence's n rows at positions pos .. pos + n - 1 (seq_stride 0), its cache pos + n long: a decoding step (n
// = 1) takes the split-K path, a prompt one block per (row, head).
template <typename T>
std::vector<float> run_gpu(const Problem<T>& p, const Case& c) {
  const int max_len = c.pos + c.n;
  test::GpuEnv env(gpu::decode_attention_at_scratch_bytes(c.n, c.NH, c.hs, max_len));
  DeviceBuffer<T> qkv = test::to_device<T>(p.qkv), k = test::to_device<T>(p.k), v = test::to_device<T>(p.v);
  std::vector<int32_t> positions(static_cast<size_t>(c.n));
  for (int i = 0; i < c.n; ++i) positions[static_cast<size_t>(i)] = c.pos + i;
  const DeviceBuffer<int32_t> dev_pos = test::ints_to_device(positions);
  DeviceBuffer<T> out(c.out_size());
  test::poison(out);
  gpu::decode_attention_at<T>(out.data(), qkv.data(), c.qkv_width(), k.data(), v.data(), 0, dev_pos.data(), c.n, c.NH,
                              c.NKV, c.hs, max_len, env.ctx);
  return test::to_host(out);
}

// Decoding steps (n = 1) at cache lengths 1, 63, 64, 65 and 200, and prefills (pos 0, n = the prompt) and chunks
// after a prefix, for every head layout.
std::vector<Case> cases() {
  std::vector<Case> out;
  const int heads[][3] = {{4, 4, 64}, {8, 2, 64}, {14, 2, 64}, {4, 1, 128}, {4, 2, 40}};
  for (const auto& h : heads) {
    for (int len : {1, 63, 64, 65, 200}) out.push_back(Case{h[0], h[1], h[2], 1, len - 1});
    out.push_back(Case{h[0], h[1], h[2], 70, 0});
    out.push_back(Case{h[0], h[1], h[2], 5, 131});
  }
  return out;
}

template <typename T>
class DecodeAttentionGpu : public ::testing::Test {};
TYPED_TEST_SUITE(DecodeAttentionGpu, test::ActivationTypes, test::ActivationNames);

TYPED_TEST(DecodeAttentionGpu, MatchesCpu) {
  ST_SKIP_WITHOUT_GPU();
  uint64_t stream = 2100;
  for (const Case& c : cases()) {
    SCOPED_TRACE(::testing::Message() << c);
    const Problem<TypeParam> p(c, stream += 3);
    EXPECT_TRUE(matches(run_gpu(p, c), p.want, kTol<TypeParam>));
  }
}

TYPED_TEST(DecodeAttentionGpu, BitReproducible) {
  ST_SKIP_WITHOUT_GPU();
  for (const Case& c : {Case{14, 2, 64, 1, 199}, Case{4, 2, 40, 70, 0}}) {
    SCOPED_TRACE(::testing::Message() << c);
    const Problem<TypeParam> p(c, 2200);
    EXPECT_TRUE(bitwise_equal(run_gpu(p, c), run_gpu(p, c)));
  }
}

TEST(DecodeAttentionGpuChecks, RejectsBadShapes) {
  ST_SKIP_WITHOUT_GPU();
  test::GpuEnv env;
  // The checks come before any device access.
  EXPECT_THROW(
      gpu::decode_attention_at<bf16>(nullptr, nullptr, 48, nullptr, nullptr, 0, nullptr, 1, 6, 4, 8, 8, env.ctx),
      Error);  // NH not a multiple of NKV
  EXPECT_THROW(gpu::decode_attention_at<bf16>(nullptr, nullptr, 1024, nullptr, nullptr, 0, nullptr, 1, 1, 1,
                                              gpu::kDecodeAttentionMaxHeadSize + 8, 8, env.ctx),
               Error);  // a head past the largest
  EXPECT_THROW(
      gpu::decode_attention_at<bf16>(nullptr, nullptr, 16, nullptr, nullptr, 0, nullptr, 1, 4, 2, 8, 8, env.ctx),
      Error);  // a query row stride shorter than the heads
  EXPECT_THROW(
      gpu::decode_attention_at<bf16>(nullptr, nullptr, 64, nullptr, nullptr, 0, nullptr, 1, 4, 2, 8, 8, env.ctx),
      Error);  // a step without the scratch of its split-K partials
}

}  // namespace
}  // namespace st
