// The run plan (run_plan.h) that `shardtrain plan` prints and start-up checks: its communication plan and attention
// bound, its terms for GPT-2 124M (plan_test_shapes.h), its verdict against the start-up check functions on the same
// inputs for every shipped config, and the smallest change plan_search.h finds.
#include "shardtrain/shard/run_plan.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "plan_test_shapes.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/kernels/scratch_sizes.h"
#include "shardtrain/model/cuda_footprint.h"
#include "shardtrain/shard/plan_search.h"

namespace st {
namespace {

using namespace plan_test;

RunTarget target(int world, int per_node, double gpu_gib, double host_gib_per_rank) {
  RunTarget t;
  t.world = world;
  t.ranks_per_node = per_node;
  t.device.free = t.device.cap = static_cast<int64_t>(gpu_gib * double(kGiB));
  t.device_name = "a test GPU";
  t.host = {static_cast<int64_t>(host_gib_per_rank * double(kGiB)), "a test budget"};
  return t;
}

TEST(RunPlan, UnknownLinkPlansTheDeepestPrefetchAndTheCopyEngines) {
  Config c = gpt2_124m(DType::kBF16);
  const CommPlan one = unknown_link_comm_plan(c, 1, false);
  EXPECT_EQ(one.prefetch_depth, 2);   // PCIe's default, the deepest of the three links
  EXPECT_FALSE(one.exchange_reduce);  // one rank reduce-scatters nothing
  EXPECT_EQ(one.replica_bucket_elements, 0);
  EXPECT_TRUE(unknown_link_comm_plan(c, 2, false).exchange_reduce);
  c.dist.prefetch_depth = 0;
  c.dist.reduce_engine = CommEngine::kSm;
  const CommPlan set = unknown_link_comm_plan(c, 2, false);
  EXPECT_EQ(set.prefetch_depth, 0);
  EXPECT_FALSE(set.exchange_reduce);
  c.dist.reduce_engine = CommEngine::kAuto;
  c.dist.reduce_scatter_ctas = 8;  // a CTA cap asks for NCCL's kernels
  EXPECT_FALSE(unknown_link_comm_plan(c, 2, false).exchange_reduce);
  // Hybrid: one bucket holds the largest shard at least (unit 0's, over 2 ranks).
  EXPECT_EQ(unknown_link_comm_plan(c, 2, true).replica_bucket_elements, kEmbedding / 2);
}

TEST(RunPlan, AttentionScratchIsTheCudnnBoundWhereCudnnMayRun) {
  Config c = gpt2_124m(DType::kBF16);
  c.train.micro_batch = 4;
  const int64_t bound = static_cast<int64_t>(gpu::cudnn_attention_scratch_bound(4, 1024, 12, 12, 64));
  EXPECT_EQ(attention_scratch_bound(c), bound);
  c.train.attention = AttentionImpl::kFlash;
  EXPECT_EQ(attention_scratch_bound(c), 0);
  c.train.attention = AttentionImpl::kAuto;
  c.train.dtype = DType::kF32;  // auto takes flash in fp32
  EXPECT_EQ(attention_scratch_bound(c), 0);
  c.train.attention = AttentionImpl::kCudnn;
  EXPECT_EQ(attention_scratch_bound(c), bound);
}

TEST(RunPlan, Gpt2SmallDevicePlanIsMemoryPlanAtTheUnknownLink) {
  Config c = gpt2_124m(DType::kBF16);
  c.train.micro_batch = 4;
  c.train.global_batch = 8;
  const RunPlan p = plan_run(c, target(2, 2, 24, 32));
  EXPECT_EQ(p.shard_world, 2);
  const ComputeFootprint f = cuda_compute_footprint(c, attention_scratch_bound(c));
  const CudaModelFootprint m = cuda_model_footprint(c.model, 4, false, DType::kBF16, attention_scratch_bound(c));
  EXPECT_EQ(f.activation_bytes, m.activation_bytes);
  // + cuBLASLt's + the reduction's + a unit's gather to the host
  EXPECT_EQ(f.workspace_bytes, m.scratch_bytes + (int64_t{32} << 20) + 512 * 8 + 2 * kGatherPieceBytes);
  const MemoryPlan want = plan_memory(c, 2, unknown_link_comm_plan(c, 2, false), f);
  EXPECT_EQ(p.device_plan.total(), want.total());
  // Gathers: unit 0 and 3 pooled blocks each way (prefetch 2), and the copy engines' whole unit 0 (the largest).
  EXPECT_EQ(p.device_plan.gather_buffers, 2 * (2 * (kEmbedding + 3 * kBlock) + kEmbedding));
  EXPECT_TRUE(p.device_fits);
  EXPECT_EQ(p.cuda_host.total(), plan_cuda_host(c, 2, 0).total());
  EXPECT_TRUE(p.fits());
}

TEST(RunPlan, GlobalBatchThatDoesNotDivideIsBadInput) {
  Config c = gpt2_124m(DType::kBF16);  // global 16, micro 16
  try {
    plan_run(c, target(2, 2, 24, 32));
    FAIL() << "a global batch of 16 planned over 2 ranks of 16";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("train.global_batch (16)"), std::string::npos) << e.what();
  }
}

bool throws_bad_input(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    return true;
  }
  return false;
}

// For every shipped config on cuda and cpu, 1 and 2 ranks, and a range of budgets: plan_run fits exactly when
// start-up's check functions (check_memory_plan, check_cuda_host_plan, check_host_memory_plan) pass on the same
// inputs. Both outcomes occur.
TEST(RunPlan, VerdictIsTheStartUpChecks) {
  int fits = 0, refused = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(SHARDTRAIN_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".ini") continue;
    for (const char* device : {"cuda", "cpu"}) {
      const bool cpu = std::string(device) == "cpu";
      std::vector<std::string> overrides{std::string("--train.device=") + device, "--train.global_batch=64",
                                         "--train.micro_batch=1"};
      if (cpu) overrides.insert(overrides.end(), {"--train.dtype=fp32", "--optim.offload=none"});
      const Config c = load_config(entry.path().string(), overrides);
      for (const int world : {1, 2}) {
        for (const double gpu : {4.0, 24.0, 139.0}) {
          for (const double host : {2.0, 16.0, 64.0}) {
            const RunTarget t = target(world, world, gpu, host);
            const RunPlan p = plan_run(c, t);
            const std::string what = str_cat(entry.path().filename().string(), " on ", device, ", ", world,
                                             " rank(s), ", gpu, " GiB GPU, ", host, " GiB host");
            if (c.train.device == Device::kCuda) {
              EXPECT_EQ(p.device_fits, !throws_bad_input([&] {
                          check_memory_plan(planned_cuda_device(c, p.shard_world, false), t.device, t.device_name);
                        }))
                  << what;
              EXPECT_EQ(p.host_fits, !throws_bad_input([&] { check_cuda_host_plan(c, world, t.host, world); })) << what;
            } else {
              EXPECT_EQ(p.host_fits, !throws_bad_input([&] { check_host_memory_plan(c, world, 0, t.host); })) << what;
            }
            (p.fits() ? fits : refused) += 1;
          }
        }
      }
    }
  }
  EXPECT_GT(fits, 50);
  EXPECT_GT(refused, 50);
}

TEST(PlanSearch, FitsAlreadyOrSmallestChange) {
  Config c = gpt2_124m(DType::kBF16);
  c.train.global_batch = 64;
  c.train.micro_batch = 16;
  const RunPlan base = plan_run(c, target(1, 1, 1000, 64));
  EXPECT_FALSE(smallest_fitting_change(c, target(1, 1, 1000, 64)).has_value());  // fits as it is

  // A GPU between the recompute plan and the full one: recompute alone fits.
  Config r = c;
  r.train.recompute = true;
  const RunPlan with_recompute = plan_run(r, target(1, 1, 1000, 64));
  ASSERT_LT(with_recompute.device_plan.total(), base.device_plan.total());
  const double between = double(with_recompute.device_plan.total()) / double(kGiB) + 0.001;
  std::optional<PlanChange> ch = smallest_fitting_change(c, target(1, 1, between, 64));
  ASSERT_TRUE(ch.has_value());
  EXPECT_EQ(ch->overrides, "--train.recompute=true");
  EXPECT_TRUE(ch->plan.fits());

  // Room for all but 6 blocks' activations: recomputing the first 6 is the smallest change.
  Config six = r;
  six.train.recompute_blocks = 6;
  const RunPlan with_six = plan_run(six, target(1, 1, 1000, 64));
  r.train.recompute_blocks = 5;
  ASSERT_GT(plan_run(r, target(1, 1, 1000, 64)).device_plan.total(), with_six.device_plan.total());
  ASSERT_GT(with_six.device_plan.total(), with_recompute.device_plan.total());
  r.train.recompute_blocks = 0;
  ch = smallest_fitting_change(c, target(1, 1, double(with_six.device_plan.total()) / double(kGiB) + 0.001, 64));
  ASSERT_TRUE(ch.has_value());
  EXPECT_EQ(ch->overrides, "--train.recompute=true --train.recompute_blocks=6");
  EXPECT_EQ(ch->config.train.recompute_blocks, 6);

  // The other way: a run that recomputes every block where 6 would do, or none.
  const double six_gib = double(with_six.device_plan.total()) / double(kGiB) + 0.001;
  ch = fewest_recomputed_blocks(r, target(1, 1, six_gib, 64));
  ASSERT_TRUE(ch.has_value());
  EXPECT_EQ(ch->overrides, "--train.recompute_blocks=6");
  EXPECT_TRUE(ch->plan.fits());
  ch = fewest_recomputed_blocks(r, target(1, 1, 1000, 64));
  ASSERT_TRUE(ch.has_value());
  EXPECT_EQ(ch->overrides, "--train.recompute=false");
  EXPECT_FALSE(ch->config.train.recompute);
  EXPECT_FALSE(fewest_recomputed_blocks(r, target(1, 1, between, 64)).has_value());  // needs every block
  EXPECT_FALSE(fewest_recomputed_blocks(c, target(1, 1, 1000, 64)).has_value());     // recomputes none

  // Recompute already on: halving the micro-batch (16 -> 8) is next.
  Config half = r;
  half.train.micro_batch = 8;
  const double after_half = double(plan_run(half, target(1, 1, 1000, 64)).device_plan.total()) / double(kGiB) + 0.001;
  ch = smallest_fitting_change(r, target(1, 1, after_half, 64));
  ASSERT_TRUE(ch.has_value());
  EXPECT_EQ(ch->overrides, "--train.micro_batch=8");

  // The state alone is too much for the GPU at micro-batch 1: the optimizer goes to the host (the smallest fraction
  // that fits), or with no host memory to spare, more GPUs.
  Config tight = c;
  tight.train.micro_batch = 1;
  tight.train.recompute = true;
  const RunPlan one = plan_run(tight, target(1, 1, 1000, 64));
  const double less_state = double(one.device_plan.total() - one.device_plan.sharded_state / 4) / double(kGiB);
  ch = smallest_fitting_change(tight, target(1, 1, less_state, 64));
  ASSERT_TRUE(ch.has_value());
  EXPECT_EQ(ch->overrides.rfind("--optim.offload=optimizer --optim.offload_fraction=", 0), 0u) << ch->overrides;
  EXPECT_EQ(ch->config.optim.offload, OffloadMode::kOptimizer);
  ch = smallest_fitting_change(tight, target(1, 1, less_state, 3.1));  // the reserve, 3 GiB, and little more
  ASSERT_TRUE(ch.has_value());
  EXPECT_EQ(ch->overrides, "--world 2");
  EXPECT_EQ(ch->target.world, 2);

  // Nothing fits a GPU smaller than the runtime's reserve.
  EXPECT_FALSE(smallest_fitting_change(tight, target(1, 1, 0.5, 64)).has_value());

  // FP8 codes kept through a step (dist.fp8_gather_keep) on a GPU that holds the run without them: they go first.
  Config kept = c;
  kept.train.fp8 = Fp8Recipe::kDelayed;
  kept.dist.fp8_gather = true;
  Config dropped = kept;
  kept.dist.fp8_gather_keep = true;
  const RunPlan without = plan_run(dropped, target(1, 1, 1000, 64));
  ASSERT_GT(plan_run(kept, target(1, 1, 1000, 64)).device_plan.total(), without.device_plan.total());
  ch = smallest_fitting_change(kept, target(1, 1, double(without.device_plan.total()) / double(kGiB) + 0.001, 64));
  ASSERT_TRUE(ch.has_value());
  EXPECT_EQ(ch->overrides, "--dist.fp8_gather_keep=false");
  EXPECT_FALSE(ch->config.dist.fp8_gather_keep);
}

// Where full fine-tuning of Llama-3.1-8B's shape needs more ranks than the target has, adapters on a frozen base fit at
// its world size: LoRA (the shipped 7-8B adapter settings, no offload) on two 24 GiB cards, QLoRA's NF4 base on one
// 16 GiB card where LoRA's bf16 base alone takes 15 GiB. Nothing where the run fits, trains adapters already, or has no
// room for either; start-up's advice names them beside the smallest change.
TEST(PlanSearch, AdaptersWhereFullFineTuningDoesNotFit) {
  Config c = llama(32, 4096, 14336, false);
  c.train.micro_batch = 1;
  c.train.global_batch = 32;
  c.train.recompute = true;
  c.optim.offload = OffloadMode::kOptimizerParams;  // configs/llama3.1-8b.ini's settings
  const RunTarget two = target(2, 2, 24, 64);
  ASSERT_FALSE(plan_run(c, two).fits());
  std::optional<PlanChange> a = adapters_that_fit(c, two);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->overrides, "--lora.rank=16 --lora.alpha=32 --lora.targets=all --optim.offload=none");
  EXPECT_TRUE(a->plan.fits());
  EXPECT_EQ(a->config.model.lora.rank, 16);
  EXPECT_EQ(a->config.model.lora.base_dtype, LoraBase::kBf16);
  EXPECT_EQ(a->target.world, 2);
  const std::string advice = misfit_advice(c, two);
  EXPECT_EQ(advice.rfind("it fits with --world ", 0), 0u) << advice;
  EXPECT_NE(advice.find(" (`shardtrain plan` prints that plan); at this world size adapters on a frozen base fit: "
                        "--lora.rank=16 --lora.alpha=32 --lora.targets=all --optim.offload=none"),
            std::string::npos)
      << advice;

  a = adapters_that_fit(c, target(1, 1, 16, 128));
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->overrides,
            "--lora.rank=16 --lora.alpha=32 --lora.targets=all --lora.base_dtype=nf4 --optim.offload=none");
  EXPECT_EQ(a->config.model.lora.base_dtype, LoraBase::kNf4);

  EXPECT_FALSE(adapters_that_fit(c, target(2, 2, 80, 64)).has_value()) << "full fine-tuning fits";
  EXPECT_FALSE(adapters_that_fit(a->config, target(1, 1, 8, 128)).has_value()) << "adapters already";
  EXPECT_FALSE(adapters_that_fit(c, target(1, 1, 4, 128)).has_value()) << "no room for either";
}

// Start-up's refusal of a device plan names the search's smallest change, or, where nothing fits, the knobs left.
TEST(PlanSearch, MisfitAdviceIsTheSmallestChange) {
  Config c = gpt2_124m(DType::kBF16);
  c.train.global_batch = 64;
  c.train.micro_batch = 16;
  c.train.recompute = true;
  c.train.recompute_blocks = 6;
  Config ten = c;
  ten.train.recompute_blocks = 10;
  const double ten_gib = double(plan_run(ten, target(1, 1, 1000, 64)).device_plan.total()) / double(kGiB) + 0.001;
  RunTarget t = target(1, 1, ten_gib, 64);
  const std::string advice = misfit_advice(c, t);
  EXPECT_EQ(advice, "it fits with --train.recompute_blocks=10 (`shardtrain plan` prints that plan)");
  try {
    check_memory_plan(planned_cuda_device(c, 1, false), t.device, t.device_name, [&] { return advice; });
    FAIL() << "6 recomputed blocks fit the budget of 10";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("a test GPU has " + format_gib(t.device.free) + " free; " + advice),
              std::string::npos)
        << e.what();
  }
  // A GPU below the runtime's reserve: no change fits, and every knob that lowers the plan is still named.
  EXPECT_EQ(
      misfit_advice(c, target(1, 1, 0.5, 64)),
      "no change in `shardtrain plan`'s search fits it; lower train.micro_batch, recompute more blocks "
      "(train.recompute_blocks; 0: all), offload more (optim.offload, optim.offload_fraction), or use more ranks");
  Config none = c;
  none.train.micro_batch = 1;
  none.train.recompute = false;
  none.train.recompute_blocks = 0;
  none.optim.offload = OffloadMode::kOptimizerParams;
  none.optim.offload_fraction = 1;
  EXPECT_EQ(misfit_advice(none, target(1, 1, 0.5, 64)),
            "no change in `shardtrain plan`'s search fits it; set train.recompute=true, or use more ranks");
}

}  // namespace
}  // namespace st
