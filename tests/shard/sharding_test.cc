#include "shardtrain/shard/sharding.h"

#include <gtest/gtest.h>

namespace st {
namespace {

// GPT-2 124M in bf16 on two workstations with one GPU each, over ~3 GB/s sockets.
ShardingEstimate two_workstations() {
  ShardingEstimate e;
  e.world = 2;
  e.local = 1;
  e.nodes = 2;
  e.params = 124'000'000;
  e.gather_bytes = e.grad_bytes = 2;
  e.world_all_gather = 3.0;
  e.replica_all_reduce = 3.0;
  return e;
}

TEST(ChooseSharding, OneGpuPerWorkstationReplicatesWhenItFits) {
  const ShardingChoice c = choose_sharding(two_workstations());
  // full: (2 gathers + 1 reduce-scatter) x 124M x 2 B x 1/2 at 3 GB/s; hybrid: all-reduce 2 x 1/2 x 124M x 2 B.
  EXPECT_NEAR(c.full_s, 3 * 124e6 * 2 * 0.5 / 3e9, 1e-9);
  EXPECT_NEAR(c.hybrid_s, 124e6 * 2 / 3e9, 1e-9);
  EXPECT_TRUE(c.hybrid);
  EXPECT_EQ(c.why,
            "hybrid: estimated communication per step 124.0 ms full, 82.7 ms hybrid (all-gather over all 2 ranks "
            "3.0 GB/s; all-reduce across the 2 nodes 3.0 GB/s); both fit in memory (dist.sharding=auto)");
}

TEST(ChooseSharding, MemoryDecidesWhenOnlyOneFits) {
  ShardingEstimate e = two_workstations();
  e.hybrid_fits = false;
  ShardingChoice c = choose_sharding(e);
  EXPECT_FALSE(c.hybrid);
  EXPECT_NE(c.why.find("; only full fits in memory (hybrid holds 2x the state per rank) (dist.sharding=auto)"),
            std::string::npos)
      << c.why;
  e.hybrid_fits = true;
  e.full_fits = false;
  e.replica_all_reduce = 0.1;  // hybrid would be slower, but it is the one that fits
  c = choose_sharding(e);
  EXPECT_GT(c.hybrid_s, c.full_s);
  EXPECT_TRUE(c.hybrid);
  EXPECT_NE(c.why.find("; only hybrid fits in memory"), std::string::npos) << c.why;
  e.hybrid_fits = false;
  c = choose_sharding(e);
  EXPECT_FALSE(c.hybrid);
  EXPECT_NE(c.why.find("neither fits in memory: full needs the least"), std::string::npos) << c.why;
}

TEST(ChooseSharding, TwoDualGpuBoxesOnALanCountNodeAndReplicaTraffic) {
  ShardingEstimate e = two_workstations();
  e.world = 4;
  e.local = 2;
  e.micro_steps = 2;
  e.world_all_gather = 1.25;  // 10 GbE bounds the world's ring
  e.node_all_gather = 20.0;   // PCIe without peer-to-peer
  e.replica_all_reduce = 1.0;
  const ShardingChoice c = choose_sharding(e);
  const double per_micro = 3 * 124e6 * 2;
  EXPECT_NEAR(c.full_s, 2 * per_micro * 0.75 / 1.25e9, 1e-9);
  EXPECT_NEAR(c.hybrid_s, 2 * per_micro * 0.5 / 20e9 + 2 * 0.5 * 62e6 * 2 / 1e9, 1e-9);
  EXPECT_TRUE(c.hybrid);
  EXPECT_NE(c.why.find("(all-gather over all 4 ranks 1.2 GB/s, within a node 20.0 GB/s; all-reduce across the 2 "
                       "nodes 1.0 GB/s)"),
            std::string::npos)
      << c.why;
}

TEST(ChooseSharding, AFastNetworkAndASlowNodeKeepFullSharding) {
  // Inside the node a slow link, across nodes a fast fabric: gathering within the node costs more than sharding
  // over everyone.
  ShardingEstimate e = two_workstations();
  e.world = 4;
  e.local = 2;
  e.world_all_gather = 40.0;
  e.node_all_gather = 2.0;
  e.replica_all_reduce = 40.0;
  const ShardingChoice c = choose_sharding(e);
  EXPECT_LT(c.full_s, c.hybrid_s);
  EXPECT_FALSE(c.hybrid);
  EXPECT_EQ(c.why.rfind("full: estimated communication per step ", 0), 0u) << c.why;
}

TEST(ChooseSharding, AGroupThatMeasuredNothingNeverWins) {
  ShardingEstimate e = two_workstations();
  e.replica_all_reduce = 0;
  EXPECT_FALSE(choose_sharding(e).hybrid);
  e = two_workstations();
  e.world_all_gather = 0;
  EXPECT_TRUE(choose_sharding(e).hybrid);
}

}  // namespace
}  // namespace st
