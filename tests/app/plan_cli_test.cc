// `shardtrain plan` as a user runs it: a config that fits (exit 0), ones that do not (exit 3) with the smallest change
// that fits, generate's plan (--generate), and bad flags (exit 2, naming the flag). No GPU is needed: every figure is
// host arithmetic.
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

// What a step's collectives move, per rank (shard/step_traffic.h): LoRA gathers its frozen base every micro-step (two
// gathers of each block a micro-step, 4 micro-steps), an NF4 base travels as its storage, FP8 gathers as codes.
TEST(PlanCli, SaysWhatAStepsCollectivesMove) {
  const std::string base = "plan --config " + config("llama3.1-8b-lora.ini") + " --world 2 --gpu-mem 24 --host-mem 64";
  const auto lora = run_shardtrain(base);
  EXPECT_EQ(lora.code, 0) << lora.output;
  expect_has(lora.output,
             "  communication, per rank and step (4 micro-step(s)): all-gathers 112.46 GiB, reduce-scatters 320.0 MiB; "
             "56.38 GiB of it between ranks\n");
  const auto fp8 = run_shardtrain(base + " --train.fp8=tensorwise --dist.fp8_gather=true");
  expect_has(fp8.output, "all-gathers 60.46 GiB, reduce-scatters 320.0 MiB; 30.39 GiB of it between ranks\n");
  const auto qlora =
      run_shardtrain("plan --config " + config("llama3.1-8b-qlora.ini") + " --world 2 --gpu-mem 24 --host-mem 64");
  expect_has(qlora.output, "all-gathers 35.29 GiB, reduce-scatters 320.0 MiB; 17.80 GiB of it between ranks\n");
}

TEST(PlanCli, Llama8bOnTwo24GiBCardsNeedsTwoMoreRanks) {
  const auto r = run_shardtrain("plan --config " + config("llama3.1-8b.ini") + " --world 2 --gpu-mem 24 --host-mem 64");
  EXPECT_EQ(r.code, 3) << r.output;
  expect_has(r.output, "(--gpu-mem 24.00 GiB): does not fit");
  expect_has(r.output, "does not fit; the smallest change that fits: --world 4 (2 node(s) of 2 rank(s))");
  // Another way to train it on these two cards, with its plan.
  expect_has(r.output,
             "at this world size, LoRA adapters on a frozen base fit: --lora.rank=16 --lora.alpha=32 "
             "--lora.targets=all --optim.offload=none\n  device, per rank: sharded state 7.83 GiB");
}

TEST(PlanCli, MicroBatchHalvedWhereRecomputeIsOn) {
  // GPT-2 124M with recompute on plans 4.81 GiB at micro-batch 16 and 4.11 GiB at 8: on 4.5 GiB the micro-batch
  // halves. The state alone would fit a smaller card with the optimizer on the host.
  const auto r = run_shardtrain("plan --config " + config("gpt2-124m.ini") +
                                " --train.device=cuda --train.recompute=true --gpu-mem 4.5 --host-mem 64");
  EXPECT_EQ(r.code, 3) << r.output;
  expect_has(r.output, "total 4.81 GiB\n    budget 4.50 GiB (--gpu-mem 4.50 GiB): does not fit");
  expect_has(r.output, "does not fit; the smallest change that fits: --train.micro_batch=8\n");
  expect_has(r.output, "total 4.11 GiB\n    budget 4.50 GiB (--gpu-mem 4.50 GiB): fits");
}

TEST(PlanCli, SaysWhereFewerBlocksRecomputedFitToo) {
  // GPT-2 124M fits an 80 GiB card without recompute: a run that recomputes is told it need not.
  const auto r = run_shardtrain("plan --config " + config("gpt2-124m.ini") +
                                " --train.device=cuda --train.recompute=true --gpu-mem 80 --host-mem 64");
  EXPECT_EQ(r.code, 0) << r.output;
  expect_has(r.output, "\nfits\nwith fewer blocks recomputed (less compute) it fits too: --train.recompute=false\n");
  const auto none = run_shardtrain("plan --config " + config("gpt2-124m.ini") +
                                   " --train.device=cuda --gpu-mem 80 --host-mem 64");
  EXPECT_EQ(none.code, 0) << none.output;
  EXPECT_EQ(none.output.find("with fewer blocks recomputed"), std::string::npos) << none.output;
}

TEST(PlanCli, OffloadWhereTheStateIsTooLarge) {
  // Qwen 2.5 1.5B on one 24 GiB card: 25.88 GiB of state, 30.09 GiB in all (its units read their shards in place);
  // with the optimizer of the last 40% of the parameters on the host it plans 23.03 GiB (parameter buffers for the
  // offloaded blocks).
  const auto r = run_shardtrain("plan --config " + config("qwen2.5-1.5b.ini") + " --gpu-mem 24 --host-mem 64");
  EXPECT_EQ(r.code, 3) << r.output;
  expect_has(r.output, "device, per rank: sharded state 25.88 GiB");
  expect_has(r.output, "the smallest change that fits: --optim.offload=optimizer --optim.offload_fraction=0.40\n");
  expect_has(r.output, "total 23.03 GiB\n    budget 24.00 GiB (--gpu-mem 24.00 GiB): fits");
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

// generate's plan: Llama-3.1-8B in bf16 (14.96 GiB of weights) splits its layers over two 12 GiB cards, 16 sequences
// at 2048 positions (a 2 GiB cache on each); on one 12 GiB card it does not fit, and the refusal says what to change.
TEST(PlanCli, GenerateSplitsWhatOneCardCannotHold) {
  const std::string llama8b = "plan --config " + config("llama3.1-8b.ini") + " --generate --gpu-mem 12 --host-mem 64";
  const auto two = run_shardtrain(llama8b + " --world 2");
  EXPECT_EQ(two.code, 0) << two.output;
  expect_has(two.output, "bf16 on cuda; generate on 2 rank(s), 2 per node\n");
  expect_has(two.output,
             "decoder: its layers split over 2 ranks (rank 0: embedding .. block.15; rank 1: block.16 .. "
             "head), 16 sequence(s) of 2048 positions\n");
  expect_has(two.output, "device, rank 1: weights 7.48 GiB, key/value caches 2.00 GiB");
  expect_has(two.output, "budget 12.00 GiB (--gpu-mem 12.00 GiB): fits\n");
  // upload: the two pinned chunks (0.03 GiB) and the rows passed between the ranks (2048 x 4096 in bf16, 0.02).
  expect_has(two.output, "host, largest: rank 1: loading 4.16 GiB, upload 0.05 GiB, reserve 3.00 GiB; total 7.21 GiB");
  EXPECT_EQ(two.output.substr(two.output.size() - 5), "fits\n");
  const auto one = run_shardtrain(llama8b);
  EXPECT_EQ(one.code, 3) << one.output;
  expect_has(one.output, "decoder: device memory: a decoder of 1 sequence(s) of 2048 positions needs 16.19 GiB (");
  expect_has(one.output,
             "but the GPU (--gpu-mem 12.00 GiB) has 12.00 GiB free; lower generate's --batch or "
             "model.seq_len, or split its layers over several GPUs");
  // --batch asks for that many sequences: 4 fit whole on one 24 GiB card.
  const auto batch =
      run_shardtrain("plan --config " + config("llama3.1-8b.ini") + " --generate --batch 4 --gpu-mem 24 --host-mem 64");
  EXPECT_EQ(batch.code, 0) << batch.output;
  expect_has(batch.output, "decoder: whole on each rank, 4 sequence(s) of 2048 positions\n");
  expect_has(batch.output, "device, per rank: weights 14.96 GiB, key/value caches 1.00 GiB");
}

// On the CPU generate's plan is the host's: Llama-3.2-1B's fp32 decoder (4.60 GiB of weights) does not fit 4 GiB.
TEST(PlanCli, GenerateOnTheCpuPlansTheHost) {
  const auto r = run_shardtrain("plan --config " + config("llama3.2-1b.ini") +
                                " --generate --train.device=cpu --train.dtype=fp32 --batch 1 --host-mem 4");
  EXPECT_EQ(r.code, 3) << r.output;
  expect_has(r.output, "fp32 on cpu; generate on 1 rank(s), 1 per node\n");
  expect_has(r.output, "host, per rank: decoder ");
  expect_has(r.output, "(weights 4.60 GiB, ");
  expect_has(r.output, "budget per rank 4.00 GiB (--host-mem gives each node 4.00 GiB): does not fit\ndoes not fit\n");
  EXPECT_EQ(r.output.find("device, "), std::string::npos) << r.output;
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
      {"plan" + gpt + " --batch 4", "plan: --batch N plans generate's sequences: give --generate too"},
      {"plan" + gpt + " --generate --batch 0", "plan: --batch expects a whole number from 1 to 1048576, got '0'"},
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
