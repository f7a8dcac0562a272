// `shardtrain plan` as a user runs it: a config that fits (exit 0), ones that do not (exit 3) with the smallest change
// that fits, and bad flags (exit 2, naming the flag). No GPU is needed: every figure is host arithmetic.
#include <gtest/gtest.h>

#include <string>

#include "../common/run_shardtrain.h"

namespace {

using st::testing::run_shardtrain;

std::string config(const std::string& name) { return std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/" + name; }

void expect_has(const std::string& output, const std::string& text) {
  EXPECT_NE(output.find(text), std::string::npos) << "missing '" << text << "' in:\n" << output;
}

TEST(PlanCli, Gpt2SmallFitsTwo24GiBCards) {
  const auto r = run_shardtrain("plan --config " + config("gpt2-124m.ini") +
                                " --train.device=cuda --train.global_batch=32 --world 2 --gpu-mem 24 --host-mem 64");
  EXPECT_EQ(r.code, 0) << r.output;
  expect_has(r.output, "2 rank(s), 2 per node, each unit sharded over 2");
  // The device plan's terms as start-up's message prints them, then the budget; the host plan per rank and node.
  expect_has(r.output, "device, per rank: sharded state 1.04 GiB, gather buffers ");
  expect_has(r.output, "budget 24.00 GiB (--gpu-mem 24.00 GiB): fits");
  expect_has(r.output, "per node (2 rank(s)): ");
  expect_has(r.output,
             "budget per rank 32.00 GiB (--host-mem gives each node 64.00 GiB, 32.00 GiB for each of its 2 ranks)");
  EXPECT_EQ(r.output.substr(r.output.size() - 5), "fits\n");
}

TEST(PlanCli, Llama8bOnTwo24GiBCardsNeedsTwoMoreRanks) {
  const auto r = run_shardtrain("plan --config " + config("llama3.1-8b.ini") + " --world 2 --gpu-mem 24 --host-mem 64");
  EXPECT_EQ(r.code, 3) << r.output;
  expect_has(r.output, "(--gpu-mem 24.00 GiB): does not fit");
  expect_has(r.output, "does not fit; the smallest change that fits: --world 4 (2 node(s) of 2 rank(s))");
}

TEST(PlanCli, MicroBatchHalvedWhereRecomputeIsOn) {
  // GPT-2 124M with recompute on plans 4.96 GiB at micro-batch 16 and 4.27 GiB at 8: on 4.5 GiB the micro-batch
  // halves. The state alone would fit a smaller card with the optimizer on the host.
  const auto r = run_shardtrain("plan --config " + config("gpt2-124m.ini") +
                                " --train.device=cuda --train.recompute=true --gpu-mem 4.5 --host-mem 64");
  EXPECT_EQ(r.code, 3) << r.output;
  expect_has(r.output, "total 4.96 GiB\n    budget 4.50 GiB (--gpu-mem 4.50 GiB): does not fit");
  expect_has(r.output, "does not fit; the smallest change that fits: --train.micro_batch=8\n");
  expect_has(r.output, "total 4.27 GiB\n    budget 4.50 GiB (--gpu-mem 4.50 GiB): fits");
}

TEST(PlanCli, OffloadWhereTheStateIsTooLarge) {
  // Qwen 2.5 1.5B on one 24 GiB card: 25.88 GiB of state, 31.19 GiB in all; with the optimizer of the last 40% of
  // the parameters on the host it plans 23.86 GiB.
  const auto r = run_shardtrain("plan --config " + config("qwen2.5-1.5b.ini") + " --gpu-mem 24 --host-mem 64");
  EXPECT_EQ(r.code, 3) << r.output;
  expect_has(r.output, "device, per rank: sharded state 25.88 GiB");
  expect_has(r.output, "the smallest change that fits: --optim.offload=optimizer --optim.offload_fraction=0.40\n");
  expect_has(r.output, "total 23.86 GiB\n    budget 24.00 GiB (--gpu-mem 24.00 GiB): fits");
}

TEST(PlanCli, CpuConfigPlansHostMemory) {
  const auto fits = run_shardtrain("plan --config " + config("tiny.ini") + " --host-mem 1");
  EXPECT_EQ(fits.code, 0) << fits.output;
  expect_has(fits.output, "fp32 on cpu");
  expect_has(fits.output, "host, per rank: sharded state 0.01 GiB");
  EXPECT_EQ(fits.output.find("device, per rank"), std::string::npos) << fits.output;
  // Less than the CPU backend's own reserve (256 MiB): nothing in the searched space fits.
  const auto no = run_shardtrain("plan --config " + config("tiny.ini") + " --host-mem 0.1");
  EXPECT_EQ(no.code, 3) << no.output;
  expect_has(no.output, "does not fit; no change of recompute, micro-batch, offload or world size");
}

TEST(PlanCli, BadFlagsAreBadInput) {
  const std::string gpt = " --config " + config("gpt2-124m.ini");
  const struct {
    std::string args, message;
  } cases[] = {
      {"plan --world 2", "plan: --config FILE is required"},
      {"plan" + gpt + " --world 0", "plan: --world expects a whole number from 1 to 1048576, got '0'"},
      {"plan" + gpt + " --world", "plan: --world needs a value"},
      {"plan" + gpt + " --gpu-mem=abc", "plan: --gpu-mem expects a positive size in GiB (e.g. 24 or 79.5), got 'abc'"},
      {"plan" + gpt + " --host-mem -4", "plan: --host-mem expects a positive size in GiB"},
      {"plan" + gpt + " --world 2 --ranks-per-node 3 --train.global_batch=32",
       "plan: --ranks-per-node 3 exceeds --world 2"},
      {"plan" + gpt + " stray", "plan: unknown argument 'stray'"},
      {"plan" + gpt + " --train.bogus=1", "unknown key 'train.bogus'"},
      {"plan" + gpt + " --world 3", "must be a multiple of train.micro_batch (16) x world size (3)"},
      {"plan" + gpt +
           " --train.device=cuda --world 4 --ranks-per-node 3 --train.global_batch=64 --dist.sharding=hybrid --gpu-mem "
           "24",
       "dist.sharding=hybrid needs nodes of equal size, but --world 4 is not a multiple of --ranks-per-node 3"},
  };
  for (const auto& c : cases) {
    const auto r = run_shardtrain(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    expect_has(r.output, c.message);
  }
}

#ifndef SHARDTRAIN_HAVE_CUDA
TEST(PlanCli, CudaConfigWithoutAGpuNeedsGpuMem) {
  const auto r = run_shardtrain("plan --config " + config("gpt2-124m.ini") + " --train.device=cuda");
  EXPECT_EQ(r.code, 2) << r.output;
  expect_has(r.output, "give --gpu-mem GiB (or set dist.max_gpu_mem_gib)");
}
#endif

}  // namespace
