// The kernels of a decoding step that read each row's position from memory (embedding_forward_at, rope_forward_at,
// kv_append_at, decode_attention_at, rope_append_attend_at) against the same kernels given the position at the call,
// and argmax_rows against its definition: the largest logit, ties to the lowest id, -1 for a row with a NaN or an
// infinity.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "grad_check.h"
#include "rope_table_shape.h"
#include "shardtrain/core/config.h"
#include "shardtrain/kernels/argmax.h"
#include "shardtrain/kernels/decode_attention.h"
#include "shardtrain/kernels/embedding.h"
#include "shardtrain/kernels/rope.h"

namespace st {
namespace {

using testing::randn;

TEST(DecodeStep, EmbeddingAtAPositionIsThatRowOfTheSequence) {
  const int V = 11, C = 8, T = 9;
  const std::vector<float> wte = randn(V * C, 1), wpe = randn(T * C, 2);
  const std::vector<int32_t> tokens = {3, 10, 0};
  const std::vector<int32_t> positions = {5, 0, 8};
  std::vector<float> got(3 * C), row(C);
  embedding_forward_at(got.data(), tokens.data(), wte.data(), wpe.data(), positions.data(), 3, C);
  for (int r = 0; r < 3; ++r) {
    // One sequence of T copies of the token: row t holds the token at position t.
    const std::vector<int32_t> seq(T, tokens[static_cast<size_t>(r)]);
    std::vector<float> all(static_cast<size_t>(T * C));
    embedding_forward(all.data(), seq.data(), wte.data(), wpe.data(), 1, T, C);
    for (int c = 0; c < C; ++c)
      EXPECT_EQ(got[static_cast<size_t>(r * C + c)],
                all[static_cast<size_t>(positions[static_cast<size_t>(r)] * C + c)])
          << "row " << r << " channel " << c;
  }
  // Without a position embedding (llama) the positions are not read.
  embedding_forward_at(got.data(), tokens.data(), wte.data(), nullptr, nullptr, 3, C);
  for (int c = 0; c < C; ++c) EXPECT_EQ(got[static_cast<size_t>(C + c)], wte[static_cast<size_t>(10 * C + c)]);
}

TEST(DecodeStep, RopeAtAPositionTurnsAsTheSequenceDoes) {
  const int NH = 4, NKV = 2, hs = 8, T = 16;
  const RopeTable table = test::llama_rope_table(NH, NKV, hs, T);
  const int64_t width = int64_t{NH + 2 * NKV} * hs;
  const std::vector<float> x = randn(T * width, 3);
  std::vector<float> all = x;
  rope_forward(all.data(), table.cos.data(), table.sin.data(), 1, T, NH, NKV, hs);
  const std::vector<int32_t> positions = {7, 0, 15};
  std::vector<float> rows;
  for (int32_t p : positions) rows.insert(rows.end(), x.begin() + p * width, x.begin() + (p + 1) * width);
  rope_forward_at(rows.data(), table.cos.data(), table.sin.data(), positions.data(), 3, NH, NKV, hs);
  for (int r = 0; r < 3; ++r)
    for (int64_t c = 0; c < width; ++c)
      EXPECT_EQ(rows[static_cast<size_t>(r * width + c)], all[static_cast<size_t>(positions[r] * width + c)])
          << "row " << r << " element " << c;
}

// Two sequences with caches of 12 positions each: appending row r at positions[r] of its cache, then attending,
// gives decode_attention of that one query at that position over that cache.
TEST(DecodeStep, AttentionAtEachRowsPositionIsThatSequencesStep) {
  const int NH = 4, NKV = 2, hs = 8, L = 12, rows = 2;
  const int64_t q_width = int64_t{NH} * hs, kv = int64_t{NKV} * hs, width = q_width + 2 * kv, seq_stride = L * kv;
  std::vector<float> k = randn(rows * seq_stride, 4), v = randn(rows * seq_stride, 5);
  const std::vector<float> qkv = randn(rows * width, 6);
  const std::vector<int32_t> positions = {9, 0};
  kv_append_at(k.data(), v.data(), qkv.data(), seq_stride, positions.data(), rows, NH, NKV, hs);
  for (int r = 0; r < rows; ++r)
    for (int64_t c = 0; c < kv; ++c) {
      const size_t at = static_cast<size_t>(r * seq_stride + positions[r] * kv + c);
      EXPECT_EQ(k[at], qkv[static_cast<size_t>(r * width + q_width + c)]);
      EXPECT_EQ(v[at], qkv[static_cast<size_t>(r * width + q_width + kv + c)]);
    }
  std::vector<float> got(static_cast<size_t>(rows * q_width)), want(static_cast<size_t>(q_width));
  decode_attention_at(got.data(), qkv.data(), width, k.data(), v.data(), seq_stride, positions.data(), rows, NH, NKV,
                      hs, L);
  for (int r = 0; r < rows; ++r) {
    decode_attention(want.data(), qkv.data() + r * width, width, k.data() + r * seq_stride, v.data() + r * seq_stride,
                     1, positions[r], NH, NKV, hs);
    for (int64_t c = 0; c < q_width; ++c) EXPECT_EQ(got[static_cast<size_t>(r * q_width + c)], want[c]) << r;
  }
}

// A sequence's last token as a decoding step (rope_append_attend_at over a cache of its first T - 1 turned keys and
// values) attends as the whole sequence's last query does (RoPE over the sequence, then causal attention), and leaves
// the token's turned key and its value in the cache.
TEST(DecodeStep, RopeAppendAttendIsTheSequencesLastStep) {
  const int NH = 4, NKV = 2, hs = 8, T = 6, L = 10;
  const int64_t q_width = int64_t{NH} * hs, kv = int64_t{NKV} * hs, width = q_width + 2 * kv;
  const RopeTable table = test::llama_rope_table(NH, NKV, hs, L);
  const std::vector<float> seq = randn(T * width, 10);
  std::vector<float> turned = seq;
  rope_forward(turned.data(), table.cos.data(), table.sin.data(), 1, T, NH, NKV, hs);
  std::vector<float> k(static_cast<size_t>(L * kv)), v(static_cast<size_t>(L * kv));
  for (int t = 0; t < T; ++t)
    for (int64_t c = 0; c < kv; ++c) {
      k[static_cast<size_t>(t * kv + c)] = turned[static_cast<size_t>(t * width + q_width + c)];
      v[static_cast<size_t>(t * kv + c)] = turned[static_cast<size_t>(t * width + q_width + kv + c)];
    }
  std::vector<float> all(static_cast<size_t>(T * q_width));
  decode_attention(all.data(), turned.data(), width, k.data(), v.data(), T, 0, NH, NKV, hs);

  std::vector<float> step_k(k.begin(), k.begin() + (T - 1) * kv), step_v(v.begin(), v.begin() + (T - 1) * kv);
  step_k.resize(k.size(), 0.0f);
  step_v.resize(v.size(), 0.0f);
  std::vector<float> row(seq.end() - width, seq.end()), out(static_cast<size_t>(q_width));
  const std::vector<int32_t> position = {T - 1};
  rope_append_attend_at(out.data(), row.data(), step_k.data(), step_v.data(), table.cos.data(), table.sin.data(), 0,
                        position.data(), 1, NH, NKV, hs, L);
  for (int64_t c = 0; c < q_width; ++c)
    EXPECT_FLOAT_EQ(out[static_cast<size_t>(c)], all[static_cast<size_t>((T - 1) * q_width + c)]) << c;
  EXPECT_EQ(step_k, k);
  EXPECT_EQ(step_v, v);
}

// A row at a negative position is idle: nothing appended to its cache, zeros out of attention, RoPE leaves it.
TEST(DecodeStep, IdleRowsTouchNothing) {
  const int NH = 2, NKV = 1, hs = 4, L = 6;
  const int64_t q_width = int64_t{NH} * hs, kv = int64_t{NKV} * hs, width = q_width + 2 * kv;
  std::vector<float> k = randn(L * kv, 7), v = randn(L * kv, 8);
  const std::vector<float> k0 = k, v0 = v, qkv = randn(width, 9);
  const std::vector<int32_t> idle = {-1};
  kv_append_at(k.data(), v.data(), qkv.data(), 0, idle.data(), 1, NH, NKV, hs);
  EXPECT_EQ(k, k0);
  EXPECT_EQ(v, v0);
  std::vector<float> out(static_cast<size_t>(q_width), 1.0f);
  decode_attention_at(out.data(), qkv.data(), width, k.data(), v.data(), 0, idle.data(), 1, NH, NKV, hs, L);
  EXPECT_EQ(out, std::vector<float>(static_cast<size_t>(q_width), 0.0f));
  const RopeTable table = test::llama_rope_table(NH, NKV, hs, L);
  std::vector<float> turned = qkv;
  rope_forward_at(turned.data(), table.cos.data(), table.sin.data(), idle.data(), 1, NH, NKV, hs);
  EXPECT_EQ(turned, qkv);
}

TEST(DecodeStep, ArgmaxIsTheLargestLogitTiesToTheLowestIdNonFiniteRowsMinusOne) {
  const int V = 6, ld = 8;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const std::vector<float> logits = {
      0.5f,  2.0f,  -1.0f, 2.0f,  1.0f,  0.0f,  9.0f, 9.0f,  // a tie at 1 and 3; the padding (9) is not the vocabulary
      -3.0f, -2.0f, -5.0f, -2.5f, -4.0f, -1.5f, 0.0f, 0.0f,  // all negative: the last
      1.0f,  nan,   0.0f,  0.0f,  0.0f,  0.0f,  0.0f, 0.0f,  // a NaN
      1.0f,  0.0f,  0.0f,  0.0f,  0.0f,  -inf,  0.0f, 0.0f,  // an infinity
  };
  std::vector<int32_t> tokens(4, 99);
  argmax_rows(logits.data(), ld, 4, V, tokens.data());
  EXPECT_EQ(tokens, (std::vector<int32_t>{1, 5, -1, -1}));
}

}  // namespace
}  // namespace st
