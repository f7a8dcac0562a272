#include "shardtrain/shard/shard_span.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "shardtrain/shard/schedule.h"

namespace st {
namespace {

TEST(ShardSpan, SpansTileTheUnitForEveryWorldSize) {
  for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{97}, int64_t{1000003}, int64_t{38633472}}) {
    for (int world = 1; world <= 8; ++world) {
      const int64_t slot = padded_shard_size(numel, world);
      EXPECT_EQ(slot, (numel + world - 1) / world);
      int64_t next = 0, padding = 0;
      for (int r = 0; r < world; ++r) {
        const ShardSpan s = shard_span(numel, r, world);
        EXPECT_EQ(s.offset, next) << numel << " " << world << " " << r;  // contiguous, disjoint, in rank order
        EXPECT_LE(s.count, slot);
        EXPECT_GE(s.count, 0);
        next = s.end();
        padding += slot - s.count;
      }
      EXPECT_EQ(next, numel) << numel << " " << world;  // covers the unit
      EXPECT_EQ(padding, slot * world - numel);          // padding lives only in memory
      EXPECT_LT(padding, world);
    }
  }
}

TEST(ShardSpan, MoreRanksThanElementsLeavesEmptySpans) {
  EXPECT_EQ(shard_span(2, 0, 4), (ShardSpan{0, 1}));
  EXPECT_EQ(shard_span(2, 1, 4), (ShardSpan{1, 1}));
  EXPECT_EQ(shard_span(2, 2, 4), (ShardSpan{2, 0}));
  EXPECT_EQ(shard_span(2, 3, 4), (ShardSpan{2, 0}));
  EXPECT_EQ(shard_span(10, 3, 4), (ShardSpan{9, 1}));
  EXPECT_EQ(shard_span(0, 0, 3), (ShardSpan{0, 0}));
}

TEST(ShardSpan, Intersect) {
  EXPECT_EQ(intersect({0, 10}, {5, 10}), (ShardSpan{5, 5}));
  EXPECT_EQ(intersect({0, 5}, {5, 10}).count, 0);
  EXPECT_EQ(intersect({3, 4}, {0, 100}), (ShardSpan{3, 4}));
}

// Every unit is gathered exactly where the schedule says and every gathered buffer is released.
TEST(Schedule, TrainingGathersEachBlockTwiceAndTheTiedEmbeddingTwice) {
  const int L = 3;
  const std::vector<ScheduleOp> s = training_schedule(L);
  std::vector<int> gathers(L + 2, 0), reduce_scatters(L + 2, 0), live(L + 2, 0);
  for (const ScheduleOp& op : s) {
    if (op.kind == OpKind::kGather) {
      ++gathers[op.unit];
      EXPECT_EQ(live[op.unit]++, 0) << to_string(op) << ": gathered while already live";
    }
    if (op.kind == OpKind::kRelease) EXPECT_EQ(live[op.unit]--, 1) << to_string(op);
    if (op.kind == OpKind::kReduceScatter) ++reduce_scatters[op.unit];
    if (op.kind == OpKind::kForward || op.kind == OpKind::kHeadForwardBackward ||
        (op.kind == OpKind::kBackward && op.unit != 0))
      EXPECT_EQ(live[op.unit], 1) << to_string(op) << " without its parameters";
  }
  EXPECT_EQ(gathers, (std::vector<int>{2, 2, 2, 2, 1}));
  EXPECT_EQ(reduce_scatters, (std::vector<int>{1, 1, 1, 1, 1}));
  EXPECT_EQ(live, (std::vector<int>(L + 2, 0)));
  // Blocks run backward last to first, and unit 0's gradient is reduce-scattered last.
  EXPECT_EQ(s.back(), (ScheduleOp{OpKind::kReduceScatter, 0}));
  const std::vector<ScheduleOp> e = eval_schedule(L);
  for (const ScheduleOp& op : e) EXPECT_NE(op.kind, OpKind::kReduceScatter);
}

// keep_embedding: the tied embedding is gathered once per micro-step and stays live from its forward through
// the head; everything else is as before.
TEST(Schedule, KeepEmbeddingGathersItOnce) {
  const int L = 3;
  for (bool reshard : {true, false}) {
    const std::vector<ScheduleOp> s = training_schedule(L, reshard, /*keep_embedding=*/true);
    std::vector<int> gathers(L + 2, 0), live(L + 2, 0);
    for (const ScheduleOp& op : s) {
      if (op.kind == OpKind::kGather) {
        ++gathers[op.unit];
        EXPECT_EQ(live[op.unit]++, 0) << to_string(op);
      }
      if (op.kind == OpKind::kRelease) EXPECT_EQ(live[op.unit]--, 1) << to_string(op);
      if (op.kind == OpKind::kForward || op.kind == OpKind::kHeadForwardBackward ||
          (op.kind == OpKind::kBackward && op.unit != 0))
        EXPECT_EQ(live[op.unit], 1) << to_string(op) << " without its parameters";
      if (op.kind == OpKind::kForward && op.unit > 0) EXPECT_EQ(live[0], 1) << to_string(op);
    }
    EXPECT_EQ(gathers, (std::vector<int>{1, reshard ? 2 : 1, reshard ? 2 : 1, reshard ? 2 : 1, 1}));
    EXPECT_EQ(live, (std::vector<int>(L + 2, 0)));
  }
  const std::vector<ScheduleOp> e = eval_schedule(L, /*keep_embedding=*/true);
  EXPECT_EQ(std::count(e.begin(), e.end(), ScheduleOp{OpKind::kGather, 0}), 1);
  EXPECT_EQ(std::count(e.begin(), e.end(), ScheduleOp{OpKind::kRelease, 0}), 1);
}

// Without resharding, each block is gathered once (forward) and stays live until its reduce-scatter.
TEST(Schedule, NoReshardGathersEachBlockOnce) {
  const int L = 3;
  const std::vector<ScheduleOp> s = training_schedule(L, /*reshard_after_forward=*/false);
  std::vector<int> gathers(L + 2, 0), live(L + 2, 0);
  int most_live = 0;
  for (const ScheduleOp& op : s) {
    if (op.kind == OpKind::kGather) {
      ++gathers[op.unit];
      EXPECT_EQ(live[op.unit]++, 0) << to_string(op);
    }
    if (op.kind == OpKind::kRelease) EXPECT_EQ(live[op.unit]--, 1) << to_string(op);
    if (op.kind == OpKind::kForward || op.kind == OpKind::kHeadForwardBackward ||
        (op.kind == OpKind::kBackward && op.unit != 0))
      EXPECT_EQ(live[op.unit], 1) << to_string(op) << " without its parameters";
    int n = 0;
    for (int u = 1; u <= L + 1; ++u) n += live[u];
    most_live = std::max(most_live, n);
  }
  EXPECT_EQ(gathers, (std::vector<int>{2, 1, 1, 1, 1}));
  EXPECT_EQ(live, (std::vector<int>(L + 2, 0)));
  EXPECT_EQ(most_live, L + 1);  // every block and the head at once, just before the head's reduce-scatter
}

}  // namespace
}  // namespace st
