// The decode attention reference against causal attention over the whole sequence (attention.h): with the keys and
// values of positions 0 .. T-1 in a cache, n queries at positions pos .. pos + n - 1 give the rows pos .. of the full
// attention's output, for multi-head and grouped-query attention.
#include "shardtrain/kernels/decode_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "grad_check.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/attention.h"

namespace st {
namespace {

struct Shape {
  int T, NH, NKV, hs;
};

// The k and v heads of every row of qkv [T, (NH + 2 NKV) hs], as a cache [T, NKV hs] each.
void split_cache(const std::vector<float>& qkv, const Shape& s, std::vector<float>* k, std::vector<float>* v) {
  const int64_t q = int64_t{s.NH} * s.hs, kv = int64_t{s.NKV} * s.hs, row = q + 2 * kv;
  for (int t = 0; t < s.T; ++t) {
    k->insert(k->end(), qkv.begin() + t * row + q, qkv.begin() + t * row + q + kv);
    v->insert(v->end(), qkv.begin() + t * row + q + kv, qkv.begin() + (t + 1) * row);
  }
}

TEST(DecodeAttention, EqualsTheRowsOfFullCausalAttention) {
  for (const Shape& s : {Shape{9, 4, 4, 8}, Shape{13, 4, 2, 16}, Shape{7, 6, 1, 4}, Shape{1, 2, 2, 8}}) {
    SCOPED_TRACE(::testing::Message() << "T " << s.T << " NH " << s.NH << " NKV " << s.NKV << " hs " << s.hs);
    const int64_t QKV = int64_t{s.NH + 2 * s.NKV} * s.hs, C = int64_t{s.NH} * s.hs;
    const std::vector<float> qkv = testing::randn(s.T * QKV, 40, 1.0f);
    std::vector<float> want(static_cast<size_t>(s.T * C)), att(static_cast<size_t>(s.NH) * s.T * s.T);
    attention_forward(want.data(), att.data(), qkv.data(), 1, s.T, s.NH, s.NKV, s.hs);
    std::vector<float> k, v;
    split_cache(qkv, s, &k, &v);
    // Every split of the sequence into a prefix already in the cache and n new queries.
    for (int pos = 0; pos < s.T; ++pos)
      for (int n = 1; pos + n <= s.T; ++n) {
        std::vector<float> got(static_cast<size_t>(n * C), NAN);
        decode_attention(got.data(), qkv.data() + pos * QKV, QKV, k.data(), v.data(), n, pos, s.NH, s.NKV, s.hs);
        const std::vector<float> rows(want.begin() + pos * C, want.begin() + (pos + n) * C);
        ASSERT_LE(testing::max_rel_diff(got, testing::to_double(rows)), testing::kRefTol)
            << "pos " << pos << " n " << n;
      }
  }
}

// Queries need not sit in qkv rows: a packed q [n, NH hs] (stride NH hs) gives the same.
TEST(DecodeAttention, TakesAnyQueryStride) {
  const Shape s{6, 4, 2, 8};
  const int64_t QKV = int64_t{s.NH + 2 * s.NKV} * s.hs, C = int64_t{s.NH} * s.hs;
  const std::vector<float> qkv = testing::randn(s.T * QKV, 41, 1.0f);
  std::vector<float> k, v, packed;
  split_cache(qkv, s, &k, &v);
  for (int t = 2; t < s.T; ++t) packed.insert(packed.end(), qkv.begin() + t * QKV, qkv.begin() + t * QKV + C);
  std::vector<float> a(static_cast<size_t>(4 * C)), b(a.size());
  decode_attention(a.data(), qkv.data() + 2 * QKV, QKV, k.data(), v.data(), 4, 2, s.NH, s.NKV, s.hs);
  decode_attention(b.data(), packed.data(), C, k.data(), v.data(), 4, 2, s.NH, s.NKV, s.hs);
  EXPECT_EQ(a, b);
}

TEST(DecodeAttention, RejectsBadShapes) {
  std::vector<float> buf(1024);
  EXPECT_THROW(decode_attention(buf.data(), buf.data(), 48, buf.data(), buf.data(), 1, 0, 6, 4, 8), Error);
  EXPECT_THROW(decode_attention(buf.data(), buf.data(), 48, buf.data(), buf.data(), 0, 0, 4, 2, 8), Error);
  EXPECT_THROW(decode_attention(buf.data(), buf.data(), 16, buf.data(), buf.data(), 1, 0, 4, 2, 8), Error);
}

}  // namespace
}  // namespace st
