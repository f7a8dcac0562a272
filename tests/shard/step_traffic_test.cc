// step_traffic (shard/step_traffic.h) against what the CPU backend's collectives count over a real step: the bytes
// its gathers receive and the gradients it reduce-scatters, at 2 and 3 ranks with accumulation, for full training,
// a LoRA base (gathered, never reduced), an NF4 base, FP8 gathers and no resharding after the forward.
#include "shardtrain/shard/step_traffic.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <string>
#include <vector>

#include "../common/fp8_tiny.h"
#include "../common/tiny_training.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/train/step_engine.h"

namespace st {
namespace {

CommCounters one_step(const Config& c, int world) {
  CommCounters out;
  fake::spawn(world, [&](Communicator& comm) {
    StepEngine e(c, comm);
    testing::Trace t;
    testing::train_steps(e, c, comm, /*seed=*/5, 0, 1, &t);
    if (comm.rank() == 0) out = e.sharded().counters();
  });
  return out;
}

TEST(StepTraffic, IsWhatAStepsCollectivesMove) {
  omp_set_num_threads(1);
  Config base = testing::fp8_tiny(ModelArch::kLlama, Fp8Recipe::kTensorwise);
  base.train.global_batch = 6;  // 3 micro-steps a step at 2 ranks, 2 at 3
  for (const std::string variant :
       {"full", "lora", "nf4", "fp8_gather", "fp8_gather_lora", "fp8_gather_keep", "no_reshard"}) {
    Config c = base;
    if (variant.find("lora") != std::string::npos || variant == "nf4") c.model.lora.rank = 4;
    if (variant == "nf4") c.model.lora.base_dtype = LoraBase::kNf4;
    if (variant.rfind("fp8_gather", 0) == 0) c.dist.fp8_gather = true;
    c.dist.fp8_gather_keep = variant == "fp8_gather_keep";
    if (variant == "no_reshard") c.dist.reshard_after_forward = false;
    for (int world : {2, 3}) {
      SCOPED_TRACE(variant + " at " + std::to_string(world) + " ranks");
      const StepTraffic s = step_traffic(c, world, world, false);
      const CommCounters n = one_step(c, world);
      EXPECT_EQ(s.micro_steps, 6 / world);
      EXPECT_EQ(s.gathered, n.gathered_bytes);
      EXPECT_EQ(s.reduce_scattered, n.reduce_scattered_elements * 4);
      EXPECT_EQ(s.across_nodes, 0);
      EXPECT_EQ(s.from_peers(), (s.gathered + s.reduce_scattered) / world * (world - 1));
    }
  }
}

// Hybrid: the gradient shards' all-reduce across r nodes moves 2 (r - 1) / r of them, once a step; the gathers and
// reduce-scatters stay within a node's ranks.
TEST(StepTraffic, HybridAddsTheAllReduceAcrossNodes) {
  Config c = testing::tiny_config();
  const StepTraffic full = step_traffic(c, 4, 4, false), hybrid = step_traffic(c, 4, 2, true);
  int64_t shards = 0;
  for (const UnitLayout& u : build_units(c.model)) shards += (u.numel + 1) / 2;
  EXPECT_EQ(hybrid.across_nodes, shards * 4 * 2 * 1 / 2);
  EXPECT_EQ(hybrid.micro_steps, full.micro_steps);
  EXPECT_EQ(hybrid.from_peers(), (hybrid.gathered + hybrid.reduce_scattered) / 2 + hybrid.across_nodes);
}

}  // namespace
}  // namespace st
