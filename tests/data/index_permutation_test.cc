#include "shardtrain/data/index_permutation.h"

#include <gtest/gtest.h>

#include <vector>

namespace st {
namespace {

std::vector<uint64_t> images(uint64_t n, uint64_t key) {
  IndexPermutation p(n, key);
  std::vector<uint64_t> out(n);
  for (uint64_t i = 0; i < n; ++i) out[i] = p(i);
  return out;
}

TEST(IndexPermutation, IsABijectionForAwkwardSizes) {
  for (uint64_t n : {1ull, 2ull, 3ull, 4ull, 5ull, 7ull, 16ull, 17ull, 255ull, 256ull, 257ull, 1000ull, 4097ull}) {
    std::vector<uint64_t> img = images(n, 0xC0FFEE + n);
    std::vector<int> hits(n, 0);
    for (uint64_t y : img) {
      ASSERT_LT(y, n) << "n=" << n;
      ++hits[y];
    }
    for (uint64_t j = 0; j < n; ++j) EXPECT_EQ(hits[j], 1) << "n=" << n << " value " << j;
  }
}

TEST(IndexPermutation, DependsOnKeyAndIsNotIdentity) {
  const uint64_t n = 1000;
  std::vector<uint64_t> a = images(n, 1), b = images(n, 2);
  int differ = 0, fixed = 0;
  for (uint64_t i = 0; i < n; ++i) {
    differ += a[i] != b[i];
    fixed += a[i] == i;
  }
  EXPECT_GT(differ, 950);      // a random pair agrees at ~1 position of 1000
  EXPECT_LT(fixed, 20);        // a random permutation fixes ~1 point
  EXPECT_EQ(images(n, 1), a);  // and is a pure function of (n, key)
}

TEST(IndexPermutation, HugeDomainStaysInRange) {
  const uint64_t n = (uint64_t{1} << 62) + 12345;
  IndexPermutation p(n, 7);
  for (uint64_t i : {uint64_t{0}, uint64_t{1}, n / 2, n - 1}) EXPECT_LT(p(i), n);
  EXPECT_NE(p(0), p(1));
}

}  // namespace
}  // namespace st
