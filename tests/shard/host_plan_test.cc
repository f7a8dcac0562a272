// The CUDA backend's host plan is host arithmetic: each term is checked against GPT-2 124M's unit sizes
// (plan_test_shapes.h) and Llama-3.1-8B's (8,030,261,248 parameters).
#include "shardtrain/shard/host_plan.h"

#include <gtest/gtest.h>

#include <string>

#include "plan_test_shapes.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"

namespace st {
namespace {

using namespace plan_test;

Config llama31_8b() {
  Config c = llama(32, 4096, 14336, false);
  c.optim.offload = OffloadMode::kOptimizer;
  return c;
}

// Staging buffers start on 4 KiB boundaries.
int64_t align4k(int64_t bytes) { return (bytes + 4095) / 4096 * 4096; }

HostMemoryBudget budget_of(int64_t bytes) { return {bytes, "a test budget of " + format_gib(bytes)}; }

// What check_cuda_host_plan refuses `c` on one rank with under `budget` bytes (kBadInput; "" and a failure if it
// passes).
std::string refusal(const Config& c, int64_t budget) {
  try {
    check_cuda_host_plan(c, 1, budget_of(budget), 1);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    return e.what();
  }
  ADD_FAILURE() << "a budget of " << format_gib(budget) << " passed";
  return "";
}

TEST(HostPlan, WithoutOffloadOnlyTheReserveAndRandomInit) {
  const HostPlan p = plan_cuda_host(gpt2_124m(DType::kBF16), 1, false);
  EXPECT_EQ(p.optimizer_state, 0);
  EXPECT_EQ(p.staging, 0);
  EXPECT_EQ(p.host_parameters, 0);
  EXPECT_EQ(p.snapshot, 0);
  EXPECT_EQ(p.loading, 4 * kEmbedding);  // one shard of random init, the largest
  EXPECT_EQ(p.total(), 4 * kEmbedding + kCudaHostReserveBytes);
}

TEST(HostPlan, OffloadedUnitsHoldTwelveBytesAndTheStagingRing) {
  Config c = gpt2_124m(DType::kBF16);
  c.optim.offload = OffloadMode::kOptimizer;
  const HostPlan p = plan_cuda_host(c, 1, false);
  EXPECT_EQ(p.optimizer_state, 12 * kParams);
  // Two of the largest unit's gradient (fp32) and result (bf16), each rounded up to 4 KiB.
  EXPECT_EQ(p.staging, 2 * (align4k(4 * kEmbedding) + align4k(2 * kEmbedding)));
  EXPECT_EQ(p.host_parameters, 0);  // on the device
  EXPECT_EQ(p.speculative, 0);
  // Speculation: the second state, and a gradient and result buffer for every unit.
  const HostPlan spec = plan_cuda_host(c, 1, true);
  EXPECT_EQ(spec.speculative, 12 * kParams);
  EXPECT_EQ(spec.staging, (4 + 2) * kParams);
  // Parameters on the host: their pinned bf16 copy, and a ring for the gradients alone.
  c.optim.offload = OffloadMode::kOptimizerParams;
  c.train.dtype = DType::kF16;
  EXPECT_EQ(plan_cuda_host(c, 1, false).host_parameters, 2 * kParams);
  EXPECT_EQ(plan_cuda_host(c, 1, false).staging, 2 * align4k(4 * kEmbedding));
  EXPECT_EQ(plan_cuda_host(c, 1, true).host_parameters, 0);  // the result buffers are the copy gathers read
}

TEST(HostPlan, OffloadFractionAndWorldSizeShrinkTheHostState) {
  Config c = gpt2_124m(DType::kBF16);
  c.optim.offload = OffloadMode::kOptimizer;
  c.optim.offload_fraction = 0.5f;  // the final LayerNorm and nine blocks (memory_plan_test.cc)
  const int64_t on_host = 1536 + 9 * kBlock, on_device = kParams - on_host;
  const HostPlan p = plan_cuda_host(c, 1, false);
  EXPECT_EQ(p.optimizer_state, 12 * on_host);
  EXPECT_EQ(p.staging, 2 * (align4k(4 * kBlock) + align4k(2 * kBlock)));  // the largest offloaded unit: a block
  // A background checkpoint copies the device-resident units' param, m and v; offloaded ones are written in place.
  c.ckpt.dir = "ck";
  EXPECT_EQ(plan_cuda_host(c, 1, false).snapshot, 12 * on_device);
  c.ckpt.async = false;
  EXPECT_EQ(plan_cuda_host(c, 1, false).snapshot, 0);
  // Two ranks: every unit of GPT-2 124M divides evenly.
  c.ckpt.dir.clear();
  EXPECT_EQ(plan_cuda_host(c, 2, false).optimizer_state, 12 * on_host / 2);
}

TEST(HostPlan, LoadingCountsTheHostViewOfOneUnit) {
  Config c = gpt2_124m(DType::kBF16);
  c.optim.offload = OffloadMode::kOptimizer;
  c.optim.offload_fraction = 0.5f;                                 // the embedding and three blocks stay on the device
  EXPECT_EQ(plan_cuda_host(c, 1, false).loading, 4 * kEmbedding);  // random init, the largest shard
  // init.from streams the device-resident units through the host one at a time: the largest is the embedding.
  c.init.from = "gpt2.safetensors";
  EXPECT_EQ(plan_cuda_host(c, 1, false).loading, 12 * kEmbedding + kStreamingIoBytes);
  c.init.from.clear();
  c.ckpt.dir = "ck";  // a resume, and synchronous saves, stream the same way
  EXPECT_EQ(plan_cuda_host(c, 1, false).loading, 12 * kEmbedding + kStreamingIoBytes);
  EXPECT_EQ(plan_cuda_host(c, 2, false).loading, 12 * kEmbedding / 2 + kStreamingIoBytes);  // its shard
  // Without offload the same unit is in hand: not the whole model's 12 bytes a parameter.
  c.optim.offload = OffloadMode::kNone;
  EXPECT_EQ(plan_cuda_host(c, 1, false).loading, 12 * kEmbedding + kStreamingIoBytes);
  c.optim.offload = OffloadMode::kOptimizer;
  c.optim.offload_fraction = 1.0f;  // nothing device-resident: offloaded units are read and written in place
  EXPECT_EQ(plan_cuda_host(c, 1, false).loading, 4 * kEmbedding);
}

TEST(HostPlan, Llama8BWithOptimizerOffloadOnOneRank) {
  const Config c = llama31_8b();
  const HostPlan p = plan_cuda_host(c, 1, false);
  EXPECT_EQ(p.optimizer_state, 12 * int64_t{8030261248});
  EXPECT_EQ(format_gib(p.optimizer_state), "89.75 GiB");
  // The head (525,336,576 + the final norm's 4,096) is the largest unit: two of its fp32 gradient and bf16 result.
  const int64_t head = int64_t{525336576} + 4096;
  EXPECT_EQ(p.staging, 2 * (4 * head + 2 * head));
  EXPECT_EQ(format_gib(p.staging), "5.87 GiB");
  // 89.75 + 5.87 + 1.96 (random init of the head) + 3 GiB of reserve.
  EXPECT_EQ(p.loading, 4 * head);
  EXPECT_EQ(format_gib(p.total()), "100.57 GiB");
  // Checkpoints and init.from add nothing: every unit is offloaded, read and written in place.
  Config with_ckpt = c;
  with_ckpt.ckpt.dir = "ck";
  with_ckpt.init.from = "Llama-3.1-8B";
  EXPECT_EQ(plan_cuda_host(with_ckpt, 1, false).total(), p.total());
}

TEST(HostPlan, AutoSpeculatesOnlyWhereTheSecondCopyFits) {
  Config c = gpt2_124m(DType::kBF16);
  c.optim.offload = OffloadMode::kOptimizer;
  const int64_t with = plan_cuda_host(c, 1, true).total();
  EXPECT_TRUE(resolve_speculation(c, 1, budget_of(with)));
  EXPECT_FALSE(resolve_speculation(c, 1, budget_of(with - 1)));
  c.optim.offload_speculative = Speculation::kOff;
  EXPECT_FALSE(resolve_speculation(c, 1, budget_of(1000 * kGiB)));
  c.optim.offload_speculative = Speculation::kOn;
  EXPECT_TRUE(resolve_speculation(c, 1, budget_of(0)));
  c.optim.offload = OffloadMode::kNone;
  EXPECT_FALSE(resolve_speculation(c, 1, budget_of(1000 * kGiB)));
}

TEST(HostPlan, RefusalGivesTheBreakdownTheLimitAndWhatFits) {
  Config c = llama31_8b();
  c.optim.offload = OffloadMode::kOptimizerParams;
  const HostPlan p = plan_cuda_host(c, 1, false);
  EXPECT_EQ(check_cuda_host_plan(c, 1, budget_of(p.total()), 1).total(), p.total());
  try {
    check_cuda_host_plan(c, 1, budget_of(64 * kGiB), 1);
    FAIL() << "a 64 GiB host passed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    const std::string m = e.what();
    EXPECT_NE(
        m.find("host memory: this config needs " + format_gib(p.total()) + " per rank (optimizer state 89.75 GiB"),
        std::string::npos)
        << m;
    EXPECT_NE(m.find("but a test budget of 64.00 GiB"), std::string::npos) << m;
    // A smaller offload share fits (its device-resident units cost the host nothing without checkpoints), or
    // twice the ranks.
    EXPECT_EQ(m.find("ckpt.async=false"), std::string::npos) << m;
    EXPECT_NE(m.find("it fits with optim.offload_fraction=0.50 (the device then holds the rest"), std::string::npos)
        << m;
    EXPECT_NE(m.find("; or 2 ranks on 2 host(s) of this size"), std::string::npos) << m;
  }
  // With background checkpoints, device-resident units are copied to pinned memory: a smaller share no longer helps.
  c.ckpt.dir = "ck";
  std::string m = refusal(c, 64 * kGiB);
  EXPECT_EQ(m.find("optim.offload_fraction"), std::string::npos) << m;
  EXPECT_NE(m.find("it fits with 2 ranks on 2 host(s) of this size"), std::string::npos) << m;
  // Synchronous checkpoints stream the device-resident units through the host one at a time: the largest unit on the
  // device costs the host 12 bytes a parameter, the rest nothing, so a smaller share fits again.
  c.ckpt.async = false;
  m = refusal(c, 64 * kGiB);
  EXPECT_NE(m.find("it fits with optim.offload_fraction=0.45 (the device then holds the rest"), std::string::npos) << m;
  c.ckpt.async = true;
  // Two ranks on one host share its budget: the message counts both.
  try {
    check_cuda_host_plan(c, 2, budget_of(16 * kGiB), 2);
    FAIL() << "16 GiB a rank passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(" for this host's 2 ranks"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace st
