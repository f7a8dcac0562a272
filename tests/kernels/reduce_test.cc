// st::accumulate_parts, the host reference of gpu::accumulate_parts.
#include "shardtrain/kernels/reduce.h"

#include <gtest/gtest.h>

#include <vector>

#include "shardtrain/core/error.h"

namespace st {
namespace {

TEST(AccumulateParts, AddsThePartsInOrderToAcc) {
  // Three parts of 2 elements at stride 3 (the third element of each slot is padding, never read).
  const std::vector<float> parts = {1, 2, -99, 10, 20, -99, 100, 200, -99};
  std::vector<float> acc = {0.5f, 0.25f};
  accumulate_parts(acc.data(), parts.data(), 3, 3, 2);
  EXPECT_EQ(acc, (std::vector<float>{111.5f, 222.25f}));
  accumulate_parts(acc.data(), parts.data(), 3, 3, 2, GradWrite::kOverwrite);
  EXPECT_EQ(acc, (std::vector<float>{111, 222}));
}

// The parts are summed first, then added to acc: 3 + (1e8 + -1e8) is 3, where (3 + 1e8) + -1e8 would be 0 in fp32.
TEST(AccumulateParts, SumsThePartsBeforeAddingToAcc) {
  const std::vector<float> parts = {1e8f, -1e8f};
  std::vector<float> acc = {3.0f};
  accumulate_parts(acc.data(), parts.data(), 2, 1, 1);
  EXPECT_EQ(acc[0], 3.0f);  // (1e8 + -1e8) = 0 first; adding 1e8 to 3 first would lose the 3
}

TEST(AccumulateParts, RejectsBadShapes) {
  std::vector<float> parts(8), acc(4);
  EXPECT_THROW(accumulate_parts(acc.data(), parts.data(), 0, 4, 4), Error);
  EXPECT_THROW(accumulate_parts(acc.data(), parts.data(), 2, 3, 4), Error);  // stride < n: parts overlap
}

}  // namespace
}  // namespace st
