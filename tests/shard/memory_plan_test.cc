// The GPU memory plan is host arithmetic: every term is checked here against numbers worked out by hand for
// GPT-2 124M; so is the CPU backend's host plan, with its budget (core/process_memory.h) and GptModel's real
// allocations (llm.c's layout: 124,475,904 parameters; unit 0 = wte + wpe 39,419,904; each block 7,087,872; the
// final LayerNorm 1,536); generate's decoder, whole and split over GPUs, for Llama-3.2-1B.
#include "shardtrain/shard/memory_plan.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <string>
#include <vector>

#include "../common/caught.h"
#include "plan_test_shapes.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/core/process_memory.h"
#include "shardtrain/model/decoder_stage.h"
#include "shardtrain/model/gpt2/gpt_model.h"
#include "shardtrain/shard/shard_span.h"

namespace st {
namespace {

using namespace plan_test;

TEST(MemoryPlan, ShardedStateIs18BytesPerParameterInBf16And16InFp32) {
  const Config bf16 = gpt2_124m(DType::kBF16), fp32 = gpt2_124m(DType::kF32);
  const CommPlan comm;
  EXPECT_EQ(plan_memory(bf16, 1, comm, {}).sharded_state, 18 * kParams);
  EXPECT_EQ(plan_memory(fp32, 1, comm, {}).sharded_state, 16 * kParams);
  // Two ranks hold half each (every unit divides evenly).
  EXPECT_EQ(plan_memory(bf16, 2, comm, {}).sharded_state, 18 * kParams / 2);
}

TEST(MemoryPlan, ShardPaddingIsCounted) {
  Config c = gpt2_124m(DType::kBF16);
  c.model.n_layer = 1;
  c.model.n_embd = 48;
  c.model.n_head = 3;
  c.model.vocab_size = 300;  // padded to 384
  c.model.seq_len = 24;
  // Units: 384*48 + 24*48 = 19,584; a block 12*48*48 + 13*48 = 28,272; the final LayerNorm 96. Over 5 ranks each
  // shard is rounded up: 3,917 + 5,655 + 20 = 9,592 elements per rank.
  EXPECT_EQ(plan_memory(c, 5, CommPlan{}, {}).sharded_state, 18 * 9592);
}

TEST(MemoryPlan, OffloadFractionMovesTheLastUnitsToTheHost) {
  Config c = gpt2_124m(DType::kBF16);
  c.optim.offload = OffloadMode::kOptimizer;
  c.optim.offload_fraction = 0.5f;
  // From the last unit back until half of the parameters are covered: the final LayerNorm and nine blocks
  // (1,536 + 9 x 7,087,872 = 63,792,384 >= 62,237,952; eight would fall short).
  std::vector<bool> want(14, false);
  for (int u = 4; u <= 13; ++u) want[static_cast<size_t>(u)] = true;
  EXPECT_EQ(offloaded_units(c, build_units(c.model)), want);
  const int64_t on_device = kEmbedding + 3 * kBlock, on_host = kParams - on_device;
  // Offloaded units keep their fp32 gradient and the bf16 copy the gathers read.
  EXPECT_EQ(plan_memory(c, 1, CommPlan{}, {}).sharded_state, 18 * on_device + 6 * on_host);

  c.optim.offload_fraction = 1.0f;
  EXPECT_EQ(plan_memory(c, 1, CommPlan{}, {}).sharded_state, 6 * kParams);
  // optimizer+params: only the gradient stays, plus two staging buffers of the largest offloaded shard.
  c.optim.offload = OffloadMode::kOptimizerParams;
  EXPECT_EQ(plan_memory(c, 1, CommPlan{}, {}).sharded_state, 4 * kParams + 2 * 2 * kEmbedding);

  c.optim.offload = OffloadMode::kNone;
  EXPECT_EQ(offloaded_units(c, build_units(c.model)), std::vector<bool>(14, false));
}

// With LoRA the embedding and the head are wholly frozen: no optimizer state to move, so never offloaded; every block
// (its adapters) is, at fraction 1.
TEST(MemoryPlan, OffloadLeavesWhollyFrozenUnits) {
  Config c = gpt2_124m(DType::kBF16);
  c.model.lora.rank = 8;
  c.optim.offload = OffloadMode::kOptimizer;
  std::vector<bool> want(14, true);
  want.front() = want.back() = false;
  EXPECT_EQ(offloaded_units(c, build_units(c.model)), want);
}

TEST(MemoryPlan, GatherBuffersFollowThePrefetchDepthAndResharding) {
  // Offloaded, one rank's units still gather their compute copies from the host's staging.
  Config c = gpt2_124m(DType::kBF16);
  c.optim.offload = OffloadMode::kOptimizerParams;
  CommPlan comm;
  comm.prefetch_depth = 1;
  // Parameters and gradients: unit 0's buffer plus two unit-sized ones each; no reduce-scatter output at one rank (the
  // shard adds the full gradient). In bf16.
  const int64_t depth1 = 2 * 2 * (kEmbedding + 2 * kBlock);
  EXPECT_EQ(plan_memory(c, 1, comm, {}).gather_buffers, depth1);
  comm.prefetch_depth = 3;
  EXPECT_EQ(param_pool_size(c, comm), 4);
  EXPECT_EQ(grad_pool_size(comm), 4);
  EXPECT_EQ(plan_memory(c, 1, comm, {}).gather_buffers, depth1 + 2 * 2 * 2 * kBlock);
  // Without resharding after forward every block and the head keep a parameter buffer until backward.
  Config keep = c;
  keep.dist.reshard_after_forward = false;
  EXPECT_EQ(param_pool_size(keep, comm), 13);
  EXPECT_EQ(plan_memory(keep, 1, comm, {}).gather_buffers, depth1 + 2 * 2 * 2 * kBlock + 2 * 9 * kBlock);
  // Copy-engine reduce-scatters land a whole unit; hybrid stages one bucket across nodes.
  comm.prefetch_depth = 1;
  comm.exchange_reduce = true;
  comm.replica_bucket_elements = 1000;
  EXPECT_EQ(plan_memory(c, 1, comm, {}).gather_buffers, depth1 + 2 * kEmbedding + 2 * 1000);
}

// At one rank the units compute on their shards, where nothing but the shard holds their parameters: no parameter
// buffers, whatever the depth or resharding, and no reduce-scatter output. A frozen base (LoRA), FP8 gathers or an
// offloaded unit bring the buffers back.
TEST(MemoryPlan, OneRankReadsItsShardsInPlace) {
  const auto params_in_place = [](const Config& c, const std::vector<UnitLayout>& units, int world) {
    const std::vector<bool> each = units_in_place(c, units, world);
    return std::all_of(each.begin(), each.end(), [](bool b) { return b; });
  };
  const Config c = gpt2_124m(DType::kBF16);
  const std::vector<UnitLayout> units = build_units(c.model);
  EXPECT_TRUE(params_in_place(c, units, 1));
  EXPECT_FALSE(params_in_place(c, units, 2));
  CommPlan comm;
  comm.prefetch_depth = 1;
  EXPECT_EQ(plan_memory(c, 1, comm, {}).gather_buffers, 2 * (kEmbedding + 2 * kBlock));  // the full gradients
  comm.prefetch_depth = 3;
  EXPECT_EQ(plan_memory(c, 1, comm, {}).gather_buffers, 2 * (kEmbedding + 4 * kBlock));
  Config keep = c;
  keep.dist.reshard_after_forward = false;
  EXPECT_EQ(plan_memory(keep, 1, comm, {}).gather_buffers, 2 * (kEmbedding + 4 * kBlock));
  Config lora = c;
  lora.model.lora.rank = 8;
  EXPECT_FALSE(params_in_place(lora, build_units(lora.model), 1));
  Config offload = c;
  offload.optim.offload = OffloadMode::kOptimizer;
  EXPECT_FALSE(params_in_place(offload, units, 1));
  // Units whose optimizer stays on the device still compute in place; the buffers serve the offloaded ones.
  offload.optim.offload_fraction = 0.5f;
  const std::vector<bool> off = offloaded_units(offload, units), each = units_in_place(offload, units, 1);
  ASSERT_EQ(each.size(), off.size());
  for (size_t u = 0; u < off.size(); ++u) EXPECT_EQ(each[u], !off[u]) << "unit " << u;
  EXPECT_TRUE(each.front());
  EXPECT_FALSE(each.back());
  // Unit 0 in place: no buffer of its own; the pool's two (prefetch depth 1) hold a block, the largest that copies.
  comm.prefetch_depth = 1;
  EXPECT_EQ(plan_memory(offload, 1, comm, {}).gather_buffers, 2 * (2 * kBlock + kEmbedding + 2 * kBlock));
  Config fp8 = c;
  fp8.train.fp8 = Fp8Recipe::kTensorwise;
  EXPECT_TRUE(params_in_place(fp8, units, 1));
  fp8.dist.fp8_gather = true;
  EXPECT_FALSE(params_in_place(fp8, units, 1));
}

TEST(MemoryPlan, WorkspaceAddsTheRuntimeReserve) {
  const MemoryPlan p = plan_memory(gpt2_124m(DType::kBF16), 1, CommPlan{}, {123, 456});
  EXPECT_EQ(p.activations, 123);
  EXPECT_EQ(p.workspace, 456 + kRuntimeReserveBytes);
  EXPECT_EQ(p.total(), p.sharded_state + p.gather_buffers + 123 + 456 + kRuntimeReserveBytes);
}

TEST(MemoryPlan, BudgetIsTheCapOrTheFreeMemory) {
  Config c = gpt2_124m(DType::kBF16);
  EXPECT_EQ(DeviceBudget::of(c, 5 * kGiB).usable(), 5 * kGiB);
  c.dist.max_gpu_mem_gib = 2.5;
  const DeviceBudget b = DeviceBudget::of(c, 5 * kGiB);
  EXPECT_TRUE(b.capped);
  EXPECT_EQ(b.usable(), 5 * kGiB / 2);
  EXPECT_EQ(DeviceBudget::of(c, kGiB).usable(), kGiB);  // the cap never adds memory
}

TEST(MemoryPlan, APlanOverTheBudgetIsBadInputWithItsBreakdown) {
  MemoryPlan p;
  p.sharded_state = 3 * kGiB;
  p.gather_buffers = kGiB / 2;
  p.activations = kGiB;
  p.workspace = kGiB / 4;  // 4.75 GiB in all
  Config c = gpt2_124m(DType::kBF16);
  EXPECT_NO_THROW(check_memory_plan(p, DeviceBudget::of(c, p.total()), "NVIDIA H200"));  // exactly fits
  c.dist.max_gpu_mem_gib = 4;
  try {
    check_memory_plan(p, DeviceBudget::of(c, 100 * kGiB), "NVIDIA H200");
    FAIL() << "a plan of 4.75 GiB passed a cap of 4 GiB";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    const std::string m = e.what();
    EXPECT_NE(m.find("needs 4.75 GiB per rank"), std::string::npos) << m;
    EXPECT_NE(m.find("sharded state 3.00 GiB, gather buffers 0.50 GiB, activations 1.00 GiB, workspace 0.25 GiB"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("dist.max_gpu_mem_gib caps it at 4.00 GiB"), std::string::npos) << m;
  }
  c.dist.max_gpu_mem_gib = 0;
  try {
    check_memory_plan(p, DeviceBudget::of(c, 2 * kGiB), "NVIDIA H200");
    FAIL() << "a plan of 4.75 GiB passed 2 GiB of free memory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("NVIDIA H200 has 2.00 GiB free"), std::string::npos) << e.what();
  }
}

// The CPU backend's plan: fp32, one sequence a micro-batch.
Config gpt2_124m_cpu() {
  Config c = gpt2_124m(DType::kF32);
  c.train.device = Device::kCpu;
  c.train.micro_batch = 1;
  return c;
}

ModelConfig small_model(int64_t vocab) {
  ModelConfig m;
  m.n_layer = 2;
  m.n_head = 4;
  m.n_embd = 64;
  m.vocab_size = vocab;
  m.seq_len = 64;
  return m;
}

TEST(HostMemoryPlan, FootprintIsWhatGptModelAllocates) {
  // Byte-level (the logits chunk holds every row) and GPT-2's vocabulary (the chunk holds 166 of 256 rows).
  for (const int64_t vocab : {int64_t{256}, int64_t{50257}}) {
    for (const Recompute recompute : {Recompute(false), Recompute(true), Recompute::first(1)}) {
      const ModelConfig m = small_model(vocab);
      const GptModel model(m, 4, recompute);
      EXPECT_EQ(GptModel::footprint_bytes(m, 4, recompute), model.allocated_bytes())
          << "vocab " << vocab << ", recompute " << recompute.count(m.n_layer);
    }
  }
}

TEST(HostMemoryPlan, Gpt2SmallOnOneRankByHand) {
  const MemoryPlan p = plan_host_memory(gpt2_124m_cpu(), 1, 0);
  EXPECT_EQ(p.sharded_state, 16 * kParams);  // param, grad, m, v in fp32
  // Full gradients: unit 0's own and one shared by the blocks and the head (the largest is a block). At one rank the
  // units read their shards in place and the shard adds the full gradient: no parameter buffers, no reduce-scatter
  // output. At two, those too: the parameters' like the gradients', and the largest shard (unit 0's).
  EXPECT_EQ(p.gather_buffers, 4 * (kEmbedding + kBlock));
  const int64_t emb2 = padded_shard_size(kEmbedding, 2), block2 = padded_shard_size(kBlock, 2);
  EXPECT_EQ(plan_host_memory(gpt2_124m_cpu(), 2, 0).gather_buffers, 4 * (4 * (emb2 + block2) + emb2));
  // B = 1, T = 1024, C = 768: per block 15 BTC + 4 BT + NH T^2 = 24,383,488 floats, 12 blocks; 12 block outputs;
  // encoded and lnf (2 BTC) and 3 BT; backward scratch 14 BTC; a 166-row logits chunk of 50304; 1024 tokens.
  EXPECT_EQ(p.activations,
            4 * (12 * 24383488 + 12 * 786432 + 2 * 786432 + 3 * 1024 + 14 * 786432 + 166 * 50304) + 4 * 1024);
  EXPECT_EQ(p.workspace, kHostReserveBytes);
  EXPECT_EQ(p.total(), p.sharded_state + p.gather_buffers + p.activations + kHostReserveBytes);
}

TEST(HostMemoryPlan, OffloadAndDtypeDoNotShrinkTheCpuState) {
  Config c = gpt2_124m_cpu();
  const MemoryPlan base = plan_host_memory(c, 2, 0);
  c.optim.offload = OffloadMode::kOptimizer;
  c.train.dtype = DType::kBF16;
  EXPECT_EQ(plan_host_memory(c, 2, 0).total(), base.total());
  EXPECT_EQ(base.sharded_state, 16 * kParams / 2);  // every unit divides evenly by 2
  // Hybrid sharding's bucket is fp32 on the CPU.
  EXPECT_EQ(plan_host_memory(gpt2_124m_cpu(), 2, 1000).gather_buffers, base.gather_buffers + 4000);
}

// Background checkpoints keep a copy of param, m and v (12 of the 16 bytes an element of state holds); saves that
// training waits for, or no checkpoints, keep none.
TEST(HostMemoryPlan, BackgroundCheckpointsPlanTheirSnapshot) {
  Config c = gpt2_124m_cpu();
  const MemoryPlan none = plan_host_memory(c, 2, 0);
  EXPECT_EQ(none.snapshot, 0);
  c.ckpt.dir = "ckpt";
  c.ckpt.async = true;
  const MemoryPlan async = plan_host_memory(c, 2, 0);
  EXPECT_EQ(async.snapshot, 12 * kParams / 2);
  EXPECT_EQ(async.total(), none.total() + 12 * kParams / 2);
  EXPECT_NE(async.breakdown().find(", checkpoint snapshot "), std::string::npos) << async.breakdown();
  c.ckpt.async = false;
  EXPECT_EQ(plan_host_memory(c, 2, 0).total(), none.total());
  EXPECT_EQ(none.breakdown().find("checkpoint"), std::string::npos) << none.breakdown();
}

TEST(HostMemoryPlan, TheSmallestLimitBindsAndSharedOnesAreSplitBetweenRanks) {
  HostMemoryLimits l;
  l.mem_available = 64 * kGiB;
  l.cgroup_limit = 48 * kGiB;
  l.cgroup_free = 40 * kGiB;
  l.as_limit = 32 * kGiB;
  l.as_free = 30 * kGiB;
  HostMemoryBudget b = host_memory_budget(l, 1, 0);
  EXPECT_EQ(b.bytes, 30 * kGiB);
  EXPECT_EQ(b.limited_by,
            "the address-space limit (RLIMIT_AS, ulimit -v) of 32.00 GiB leaves 30.00 GiB to this process");
  b = host_memory_budget(l, 2, 0);  // the cgroup's 40 GiB between 2 ranks; RLIMIT_AS is each process's own
  EXPECT_EQ(b.bytes, 20 * kGiB);
  EXPECT_EQ(b.limited_by,
            "the cgroup's memory limit (memory.max) of 48.00 GiB leaves 40.00 GiB, shared by the 2 ranks on this host");
  l.data_limit = 8 * kGiB;
  l.data_free = 7 * kGiB;
  EXPECT_EQ(host_memory_budget(l, 2, 0).bytes, 7 * kGiB);
  const HostMemoryLimits host_only{16 * kGiB};
  b = host_memory_budget(host_only, 4, 0);
  EXPECT_EQ(b.bytes, 4 * kGiB);
  EXPECT_EQ(b.limited_by, "the host has 16.00 GiB available (MemAvailable), shared by the 4 ranks on this host");
  // dist.max_host_mem_gib binds where it is the smallest, and only then.
  b = host_memory_budget(host_only, 4, 2.5);
  EXPECT_EQ(b.bytes, 5 * kGiB / 2);
  EXPECT_EQ(b.limited_by, "dist.max_host_mem_gib caps each rank at 2.50 GiB");
  EXPECT_EQ(host_memory_budget(host_only, 4, 6).bytes, 4 * kGiB);
  EXPECT_EQ(host_memory_budget(host_only, 4, 6).limited_by,
            "the host has 16.00 GiB available (MemAvailable), shared by the 4 ranks on this host");
  HostMemoryBudget given{48 * kGiB, "--host-mem"};  // plan's flag, capped by the config
  cap_host_memory_budget(&given, 40);
  EXPECT_EQ(given.bytes, 40 * kGiB);
  cap_host_memory_budget(&given, 0);
  EXPECT_EQ(given.bytes, 40 * kGiB);
}

TEST(HostMemoryPlan, RlimitsAreRead) {
  const HostMemoryLimits before = host_memory_limits();
  EXPECT_GT(before.mem_available, 64 << 20);
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_DATA, &saved), 0);
  if (saved.rlim_max != RLIM_INFINITY) GTEST_SKIP() << "RLIMIT_DATA has a hard limit here";
  rlimit r = saved;
  r.rlim_cur = static_cast<rlim_t>(1000) * kGiB;
  ASSERT_EQ(setrlimit(RLIMIT_DATA, &r), 0);
  const HostMemoryLimits l = host_memory_limits();
  ASSERT_EQ(setrlimit(RLIMIT_DATA, &saved), 0);
  EXPECT_EQ(l.data_limit, 1000 * kGiB);
  EXPECT_GT(l.data_free, 999 * kGiB);  // less this process's data segment
  EXPECT_LT(l.data_free, 1000 * kGiB);
}

TEST(HostMemoryPlan, APlanOverTheBudgetIsBadInputWithItsBreakdown) {
  const Config c = gpt2_124m_cpu();
  const MemoryPlan p = plan_host_memory(c, 1, 0);
  EXPECT_NO_THROW(check_host_memory_plan(c, 1, 0, HostMemoryBudget{p.total(), "x"}));  // exactly fits
  try {
    check_host_memory_plan(c, 1, 0, HostMemoryBudget{2 * kGiB, "the host has 2.00 GiB available (MemAvailable)"});
    FAIL() << "a plan of " << p.total() << " bytes passed 2 GiB";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    const std::string m = e.what();
    EXPECT_NE(m.find("host memory: this config needs 3.48 GiB per rank (sharded state 1.85 GiB, gather buffers 0.17 "
                     "GiB, activations 1.20 GiB, workspace 0.25 GiB; total 3.48 GiB), but the host has 2.00 GiB "
                     "available (MemAvailable); lower train.micro_batch"),
              std::string::npos)
        << m;
  }
}

TEST(HostMemoryPlan, AModelPastTheArithmeticIsRefusedOnItsEstimate) {
  Config c = gpt2_124m_cpu();
  c.model.n_embd = 2000000000;  // 12 L C^2 is past 2^63 elements
  c.model.n_head = 1;
  try {
    check_host_memory_plan(c, 1, 0, HostMemoryBudget{64 * kGiB, "the host has 64.00 GiB available (MemAvailable)"});
    FAIL() << "n_embd 2e9 passed";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    const std::string m = e.what();
    EXPECT_NE(m.find("host memory: this config needs about 8.58e+12 GiB per rank (5.76e+20 parameters), but the host "
                     "has 64.00 GiB available"),
              std::string::npos)
        << m;
  }
}

// generate's decoder against the device budget: what fits passes; the rest is refused naming the footprint's
// breakdown, the limit (the device's free memory, or dist.max_gpu_mem_gib where it binds) and what to lower; without
// --batch the most sequences that fit are taken.
TEST(DecoderMemory, ADecoderThatDoesNotFitIsRefusedWithItsBreakdown) {
  Config cfg = plan_test::llama_1b();
  const int64_t gib = plan_test::kGiB;
  EXPECT_NO_THROW(check_decoder_memory(cfg, 1, DeviceBudget::of(cfg, 6 * gib), "GPU"));
  const DecoderFootprint f = decoder_footprint(cfg.model, DType::kBF16, 64);
  const Error big = testing::caught(
      [&] { check_decoder_memory(cfg, 64, DeviceBudget::of(cfg, 4 * gib), "NVIDIA GeForce RTX 4090"); });
  EXPECT_EQ(big.kind(), ErrorKind::kBadInput);
  const std::string want = "device memory: a decoder of 64 sequence(s) of 2048 positions needs " +
                           format_gib(f.total()) + " (" + f.breakdown() +
                           "), but NVIDIA GeForce RTX 4090 has 4.00 GiB free; lower generate's --batch or "
                           "model.seq_len, or split its layers over several GPUs (mpirun -np N shardtrain generate)";
  EXPECT_NE(std::string(big.what()).find(want), std::string::npos) << big.what();
  // In fp32 the message also says bf16 would halve it.
  Config fp32 = cfg;
  fp32.train.dtype = DType::kF32;
  const Error wide = testing::caught([&] { check_decoder_memory(fp32, 64, DeviceBudget::of(fp32, 4 * gib), "GPU"); });
  EXPECT_NE(std::string(wide.what())
                .find("; lower generate's --batch or model.seq_len, compute in bf16 (train.dtype), "
                      "or split its layers over several GPUs"),
            std::string::npos)
      << wide.what();
  const int fit = fitting_batch(cfg, 64, DeviceBudget::of(cfg, 6 * gib));
  EXPECT_GT(fit, 1);
  EXPECT_LT(fit, 64);
  EXPECT_LE(decoder_footprint(cfg.model, DType::kBF16, fit).total(), 6 * gib);
  EXPECT_GT(decoder_footprint(cfg.model, DType::kBF16, fit + 1).total(), 6 * gib);
  EXPECT_EQ(fitting_batch(cfg, 64, DeviceBudget::of(cfg, gib)), 1);  // not even one: the check then refuses it
  EXPECT_EQ(fitting_batch(cfg, 3, DeviceBudget::of(cfg, 80 * gib)), 3);
  cfg.dist.max_gpu_mem_gib = 3;
  EXPECT_EQ(fitting_batch(cfg, 3, DeviceBudget::of(cfg, 80 * gib)), 1);
  const Error capped =
      testing::caught([&] { check_decoder_memory(cfg, 1, DeviceBudget::of(cfg, 80 * gib), "NVIDIA H200"); });
  EXPECT_NE(std::string(capped.what()).find("but dist.max_gpu_mem_gib caps it at 3.00 GiB;"), std::string::npos)
      << capped.what();
}

// Llama-3.2-1B over 2 GPUs: embedding_tokens 128,256 x 2,048 = 262,668,288 elements, each block 60,821,504, the head
// its final norm's 2,048 (tied). The halves are the embedding and blocks 0-7, and blocks 8-15 with the head and the
// tied classifier's copy of the embedding.
TEST(DecoderMemory, AStageHoldsItsUnitsWeightsAndItsLayersCaches) {
  const Config cfg = llama_1b();
  const std::vector<UnitRange> halves = split_units(cfg.model, 4, 2);
  ASSERT_EQ(halves.size(), 2u);
  EXPECT_EQ(halves[0].end, 9);
  const DecoderFootprint whole = decoder_footprint(cfg.model, DType::kBF16, 4);
  const std::vector<DecoderFootprint> f = stage_footprints(cfg, 4, 2);
  ASSERT_EQ(f.size(), 2u);
  constexpr int64_t kEmbedding = 262668288, kLlamaBlock = 60821504;
  EXPECT_EQ(f[0].weights, 2 * (kEmbedding + 8 * kLlamaBlock));
  EXPECT_EQ(f[1].weights, 2 * (kEmbedding + 8 * kLlamaBlock + 2048));
  EXPECT_EQ(f[0].weights + f[1].weights, whole.weights + 2 * kEmbedding);
  EXPECT_EQ(f[0].cache, 8 * 4 * (int64_t{4} << 20));  // 4 MiB a layer and sequence
  EXPECT_EQ(f[0].cache + f[1].cache, whole.cache);
  EXPECT_EQ(whole.activations - f[0].activations, 2 * 4 * 128256);  // the logits rows: the last stage's alone
  EXPECT_EQ(f[1].activations, whole.activations);
  EXPECT_EQ(f[0].runtime, whole.runtime);
  EXPECT_EQ(stage_footprints(cfg, 4, 1)[0].total(), whole.total());
}

TEST(DecoderMemory, AutoSplitsTheLayersWhenTheWholeDoesNotFitAndRefusesASplitThatDoesNot) {
  const Config cfg = llama_1b();
  const int64_t whole = decoder_footprint(cfg.model, DType::kBF16, 1).total();
  const std::vector<DecoderFootprint> stages = stage_footprints(cfg, 1, 2);
  const int64_t largest = std::max(stages[0].total(), stages[1].total());
  ASSERT_LT(largest, whole);
  const DeviceBudget between = DeviceBudget::of(cfg, (whole + largest) / 2), roomy = DeviceBudget::of(cfg, 80 * kGiB);
  auto place = [&](LayerSplit split, int ranks, const DeviceBudget& budget, int want = 1, bool fit = false) {
    return place_decoder(cfg, want, fit, split, ranks, budget, "NVIDIA GeForce RTX 4090");
  };
  EXPECT_EQ(place(LayerSplit::kAuto, 2, roomy).stages, 1);
  EXPECT_EQ(place(LayerSplit::kAuto, 2, between).stages, 2);
  EXPECT_EQ(place(LayerSplit::kLayers, 2, roomy).stages, 2);
  EXPECT_EQ(place(LayerSplit::kLayers, 1, roomy).stages, 1);  // one rank, one stage
  EXPECT_EQ(place(LayerSplit::kAuto, 2, roomy, 16, true).max_batch, 16);
  // Fitting sequences: the whole model holds none in `between`, so auto splits and fits what the stages hold.
  const DecoderPlacement fitted = place(LayerSplit::kAuto, 3, between, 16, true);
  EXPECT_EQ(fitted.stages, 3);
  EXPECT_EQ(fitted.max_batch, fitting_batch(cfg, 16, between, 3));
  EXPECT_GT(fitted.max_batch, 1);
  auto refusal = [&](LayerSplit split, int ranks, const DeviceBudget& budget) {
    const Error e = testing::caught([&] { place(split, ranks, budget); });
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    return std::string(e.what());
  };
  // Kept whole (none, or one rank): the whole model's refusal.
  const std::string whole_needs = "a decoder of 1 sequence(s) of 2048 positions needs " + format_gib(whole) + " (";
  EXPECT_NE(refusal(LayerSplit::kNone, 2, between).find(whole_needs), std::string::npos);
  EXPECT_NE(refusal(LayerSplit::kAuto, 1, between).find(whole_needs), std::string::npos);
  // A split that does not fit either: every stage's breakdown.
  const std::string split = refusal(LayerSplit::kAuto, 2, DeviceBudget::of(cfg, largest - 1));
  const std::string want =
      "device memory: a decoder of 1 sequence(s) of 2048 positions split over 2 GPUs needs " + format_gib(largest) +
      " on its largest stage (rank 0 (embedding .. block.7): " + stages[0].breakdown() +
      "; rank 1 (block.8 .. head): " + stages[1].breakdown() + "), but NVIDIA GeForce RTX 4090 has " +
      format_gib(largest - 1) + " free; lower generate's --batch or model.seq_len, or split over more GPUs";
  EXPECT_NE(split.find(want), std::string::npos) << split;
  EXPECT_NE(refusal(LayerSplit::kLayers, 17, roomy).find("a layer split over 17 ranks needs a block for each"),
            std::string::npos);
}

}  // namespace
}  // namespace st
