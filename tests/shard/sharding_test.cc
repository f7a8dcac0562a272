#include "shardtrain/shard/sharding.h"

#include <gtest/gtest.h>

#include "../common/fp8_tiny.h"
#include "shardtrain/model/nf4_base.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/shard_span.h"
#include "shardtrain/shard/step_traffic.h"

namespace st {
namespace {

// GPT-2 124M in bf16 on two workstations with one GPU each, over ~3 GB/s sockets.
ShardingEstimate two_workstations() {
  ShardingEstimate e;
  e.world = 2;
  e.local = 1;
  e.nodes = 2;
  e.params = 124'000'000;
  e.gathered_bytes = 2 * e.params;
  e.grad_bytes = 2;
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

// What one gather of every unit moves: every tensor at the element size in full fine-tuning; with LoRA the frozen
// base besides the adapters (most of it); an NF4 base as its storage, where there are ranks to gather it from; under
// dist.fp8_gather each block segment as its codes (a byte an element), its norms again in fp32 and 4 maxima.
TEST(GatheredModelBytes, CountsTheFrozenBaseNf4StorageAndFp8Codes) {
  Config c = testing::fp8_tiny(ModelArch::kLlama, Fp8Recipe::kTensorwise);  // fp32 on the cpu: 4 bytes an element
  const auto all = [](const Config& cfg) { return count_params(build_units(cfg.model)); };
  EXPECT_EQ(gathered_model_bytes(c, 1), 4 * all(c));
  Config lora = c;
  lora.model.lora.rank = 4;
  EXPECT_EQ(gathered_model_bytes(lora, 1), 4 * all(lora));
  EXPECT_GT(all(lora), 4 * count_trainable_params(build_units(lora.model)));  // the base is most of it
  Config nf4 = lora;
  nf4.model.lora.base_dtype = LoraBase::kNf4;
  int64_t want = 0;
  for (const UnitLayout& u : build_units(nf4.model))
    want +=
        4 * 2 * padded_shard_size(u.numel, 2) + (u.nf4_base ? 4 * 2 * padded_shard_size(nf4_unit_storage(u).words, 2)
                                                            : 4 * 2 * padded_shard_size(u.frozen_numel, 2));
  EXPECT_EQ(gathered_model_bytes(nf4, 2), want);
  EXPECT_LT(gathered_model_bytes(nf4, 2), gathered_model_bytes(lora, 2));
  // A block's 3,104 elements (q/k/v [32, 16], o [16, 16], gate/up [96, 16], down [16, 48], two norms of 16): 3,104
  // code bytes, the 32 norm elements in fp32 and 4 maxima instead of 3,104 elements in fp32; two blocks.
  for (Config* cfg : {&c, &lora}) {
    Config on = *cfg;
    on.dist.fp8_gather = true;
    EXPECT_EQ(gathered_model_bytes(on, 1), gathered_model_bytes(*cfg, 1) - 2 * (4 * 3104 - (3104 + 4 * 32 + 4 * 4)));
  }
}

}  // namespace
}  // namespace st
