// dist.fp8_gather on the CPU backend (shard/fp8_gather.h): the plan of each segment, the two helpers its gathers use
// against the casts they stand for, and training with it: the bits of training without it at 1 to 4 ranks, for
// both families, full and LoRA, with the bytes each gather receives as the plan counts them.
#include "shardtrain/shard/fp8_gather.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../common/config_problem.h"
#include "../common/fp8_tiny.h"
#include "../common/tiny_training.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/kernels/fp8.h"
#include "shardtrain/kernels/scratch_sizes.h"
#include "shardtrain/model/family.h"
#include "shardtrain/shard/memory_plan.h"
#include "shardtrain/shard/shard_span.h"
#include "shardtrain/shard/step_traffic.h"
#include "shardtrain/train/step_engine.h"

namespace st {
namespace {

constexpr uint64_t kSeed = 5;

Config tiny(ModelArch arch, int lora_rank = 0, Fp8Recipe recipe = Fp8Recipe::kTensorwise) {
  Config c = testing::fp8_tiny(arch, recipe);
  c.train.steps = 3;
  c.model.lora.rank = lora_rank;
  if (lora_rank > 0) c.optim.lr = 1e-1f;  // the adapters move the loss within 3 steps
  return c;
}

Fp8Policy tensorwise() { return fp8_policy(Fp8Recipe::kTensorwise); }

// Every element of the segment in exactly one piece, each piece inside its rank's span; weight pieces' codes where the
// elements sit in the rank's slot; the rest packed in order, rest_slot the most a rank packs.
void expect_plan_covers(const Fp8GatherSegment& g) {
  std::vector<int> seen(static_cast<size_t>(g.numel), 0);
  std::vector<int64_t> packed(static_cast<size_t>(g.world), 0);
  for (const Fp8GatherPiece& p : g.pieces) {
    const ShardSpan span = shard_span(g.numel, p.rank, g.world);
    ASSERT_GT(p.count, 0);
    EXPECT_GE(p.offset, span.offset);
    EXPECT_LE(p.offset + p.count, span.end());
    for (int64_t i = p.offset; i < p.offset + p.count; ++i) ++seen[static_cast<size_t>(i)];
    if (p.weight >= 0) {
      const Fp8GatherWeight& w = g.weights[static_cast<size_t>(p.weight)];
      EXPECT_GE(p.offset, w.offset);
      EXPECT_LE(p.offset + p.count, w.offset + w.numel);
      EXPECT_EQ(p.staged_at, p.offset - int64_t{p.rank} * g.slot);
    } else {
      EXPECT_EQ(p.staged_at, packed[static_cast<size_t>(p.rank)]);
      packed[static_cast<size_t>(p.rank)] += p.count;
    }
  }
  for (int64_t i = 0; i < g.numel; ++i) EXPECT_EQ(seen[static_cast<size_t>(i)], 1) << "element " << i;
  EXPECT_EQ(g.rest_slot, *std::max_element(packed.begin(), packed.end()));
  EXPECT_EQ(g.code_stride % 4, 0);
  EXPECT_GE(g.code_stride, g.slot);
}

TEST(Fp8GatherPlan, ABlocksWeightsAreCodesAndEveryElementArrivesOnce) {
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama})
    for (int world : {1, 2, 3, 5}) {
      SCOPED_TRACE(std::string(to_string(arch)) + " world " + std::to_string(world));
      const Config c = tiny(arch);
      const std::vector<UnitLayout> units = build_units(c.model);
      EXPECT_TRUE(fp8_gather_segment(c.model, units.front(), false, world, tensorwise()).empty());  // embedding
      EXPECT_TRUE(fp8_gather_segment(c.model, units.back(), false, world, tensorwise()).empty());   // head
      const UnitLayout& block = units[1];
      const Fp8GatherSegment g = fp8_gather_segment(c.model, block, false, world, tensorwise());
      ASSERT_EQ(g.weights.size(), 4u);  // q/k/v, o (proj), gate/up (fc), down (proj)
      for (const char* name : {"attn.qkv.weight", "mlp.down.weight", "mlp.proj.weight"}) {
        const TensorSpec* t = block.find(name);
        if (t == nullptr) continue;
        EXPECT_TRUE(std::any_of(g.weights.begin(), g.weights.end(), [&](const Fp8GatherWeight& w) {
          return w.offset == t->offset && w.numel == t->numel;
        })) << name;
      }
      // Each weight names its site, whose W the delayed history keeps: block 1's, in the family's order.
      const std::vector<LinearShape> shapes = block_linear_shapes(c.model);
      for (const Fp8GatherWeight& w : g.weights) {
        const auto it = std::find_if(shapes.begin(), shapes.end(),
                                     [&](const LinearShape& l) { return block.tensor(l.weight).offset == w.offset; });
        ASSERT_NE(it, shapes.end());
        EXPECT_EQ(w.site, static_cast<int64_t>(shapes.size()) * block.layer + (it - shapes.begin()));
      }
      EXPECT_EQ(g.slot, padded_shard_size(block.numel, world));
      expect_plan_covers(g);
      // Both of a rank's gathers' bytes: its block and every weight's maximum from each rank.
      EXPECT_EQ(g.received_bytes(2), world * (g.code_stride + 2 * g.rest_slot + 16));
      EXPECT_LT(g.received_bytes(2), 2 * g.slot * world);  // under half of bf16's
    }
}

TEST(Fp8GatherPlan, LoraGathersItsBaseAsCodesAndRowwiseOrNf4NoSegment) {
  const Config c = tiny(ModelArch::kLlama, /*lora_rank=*/4);
  const std::vector<UnitLayout> units = build_units(c.model);
  const UnitLayout& block = units[1];
  EXPECT_TRUE(fp8_gather_segment(c.model, block, false, 2, tensorwise()).empty());  // the adapters
  const Fp8GatherSegment base = fp8_gather_segment(c.model, block, true, 2, tensorwise());
  EXPECT_EQ(base.base, block.numel);
  EXPECT_EQ(base.weights.size(), 4u);
  expect_plan_covers(base);
  EXPECT_TRUE(fp8_gather_segment(c.model, block, true, 2, fp8_policy(Fp8Recipe::kRowwise)).empty());
  Config nf4 = c;
  nf4.model.lora.base_dtype = LoraBase::kNf4;
  EXPECT_TRUE(fp8_gather_segment(nf4.model, build_units(nf4.model)[1], true, 2, tensorwise()).empty());
}

// On cuda a cast weight's codes start at the first 256-byte boundary of its region (the alignment a cast's own buffer
// has, which cuBLASLt's choice of algorithm sees), its inverse scale right after them, where both fit the region.
TEST(Fp8GatherPlan, WeightCodesSitAtTheRegionsFirst256ByteBoundary) {
  alignas(256) static uint8_t buf[4096];
  EXPECT_EQ(fp8_weight_codes(buf, 256, 2), buf);
  EXPECT_EQ(fp8_weight_codes(buf + 32, 256, 2), buf + 256);  // 224 + 256 codes + 4 <= 512 bytes
  EXPECT_EQ(fp8_weight_codes(buf + 2, 256, 2), nullptr);     // 254 + 256 + 4 > 512
  EXPECT_EQ(fp8_weight_codes(buf + 2, 260, 2), buf + 256);   // 254 + 260 + 4 <= 520
  EXPECT_EQ(fp8_weight_codes(buf + 4, 256, 4), buf + 256);
}

// A tensor's parts' maxima give the whole tensor's scale, and each part cast with it gives the whole cast's codes; a
// cast's codes transposed are the transposed cast's.
TEST(Fp8GatherKernels, PartsCastAsTheWholeTensorAndTransposeAsTheTransposedCast) {
  const int64_t rows = 48, cols = 32, n = rows * cols;
  std::vector<float> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) w[static_cast<size_t>(i)] = 0.3f * uniform_pm1_at(9, static_cast<uint64_t>(i));
  w[777] = -2.5f;  // the largest magnitude, in the second part
  std::vector<uint8_t> whole(static_cast<size_t>(n)), transposed(static_cast<size_t>(n));
  float whole_inv = 0, transposed_inv = 0;
  fp8_quantize_matrix(w.data(), rows, cols, Fp8Format::kE4M3, Fp8Scaling::kTensor, false, Fp8Layout::kRowMajor,
                      whole.data(), &whole_inv, "w");
  fp8_quantize_matrix(w.data(), rows, cols, Fp8Format::kE4M3, Fp8Scaling::kTensor, false, Fp8Layout::kTransposed,
                      transposed.data(), &transposed_inv, "w");
  // Three parts over three "ranks", one tensor (k = 1), the third part empty.
  const int64_t cut[] = {0, 500, n, n};
  std::vector<unsigned> part_max(3, 0u);
  for (int r = 0; r < 3; ++r)
    if (cut[r + 1] > cut[r])
      fp8_maxima(w.data() + cut[r], 1, cut[r + 1] - cut[r], Fp8Scaling::kTensor, &part_max[r], "w");
  unsigned m = 0;
  float inv = 0;
  fp8_scales_of_parts(part_max.data(), 3, 1, Fp8Format::kE4M3, false, &m, &inv);
  EXPECT_EQ(inv, whole_inv);
  float m_value = 0;
  std::memcpy(&m_value, &m, sizeof(m));
  EXPECT_EQ(m_value, 2.5f);
  std::vector<uint8_t> parts(static_cast<size_t>(n));
  for (int r = 0; r < 2; ++r) {
    float unused = 0;
    fp8_quantize_with_maxima(w.data() + cut[r], 1, cut[r + 1] - cut[r], Fp8Format::kE4M3, Fp8Scaling::kTensor, false,
                             Fp8Layout::kRowMajor, &m, parts.data() + cut[r], &unused);
  }
  EXPECT_EQ(parts, whole);
  std::vector<uint8_t> t(static_cast<size_t>(n));
  fp8_transpose(whole.data(), rows, cols, t.data());
  EXPECT_EQ(t, transposed);
  // Two tensors (k = 2): each takes the largest of its own column; none of a tensor's parts: maximum 0, a finite scale.
  const unsigned two[] = {5u, 0u, 9u, 0u};  // [world 2][k 2]
  unsigned out[2];
  float out_inv[2];
  fp8_scales_of_parts(two, 2, 2, Fp8Format::kE5M2, false, out, out_inv);
  EXPECT_EQ(out[0], 9u);
  EXPECT_EQ(out[1], 0u);
  EXPECT_EQ(out_inv[1], 1.0f / fp8_scale(0.0f, Fp8Format::kE5M2));
}

TEST(Fp8GatherConfig, NeedsOneScaleATensorAndNoNf4Base) {
  const auto problem = testing::config_problem;
  EXPECT_EQ(problem({"--train.fp8=tensorwise", "--dist.fp8_gather=true"}), "");
  EXPECT_EQ(problem({"--train.fp8=delayed", "--dist.fp8_gather=true"}), "");
  EXPECT_NE(problem({"--train.fp8=rowwise", "--dist.fp8_gather=true"})
                .find("dist.fp8_gather (true) needs train.fp8=tensorwise or delayed (got rowwise)"),
            std::string::npos);
  EXPECT_NE(problem({"--dist.fp8_gather=true"}).find("needs train.fp8=tensorwise or delayed (got off)"),
            std::string::npos);
  EXPECT_NE(problem({"--train.fp8=tensorwise", "--dist.fp8_gather=true", "--lora.rank=4", "--lora.base_dtype=nf4"})
                .find("dist.fp8_gather (true) does not apply with lora.base_dtype=nf4"),
            std::string::npos);
}

// The plan's gather buffers grow by fp8_gather_staging_bytes: what the CUDA gatherer allocates.
TEST(Fp8GatherConfig, ThePlanCountsTheStaging) {
  Config c = tiny(ModelArch::kLlama);
  const MemoryPlan off = plan_host_memory(c, 3, 0);
  c.dist.fp8_gather = true;
  const MemoryPlan on = plan_host_memory(c, 3, 0);
  const std::vector<UnitLayout> units = build_units(c.model);
  const int64_t staging = fp8_gather_staging_bytes(c.model, units, 3, tensorwise(), 4);
  const Fp8GatherSegment g = fp8_gather_segment(c.model, units[1], false, 3, tensorwise());
  // Four weights a block: blocks sent and received by 3 ranks, maxima sent, received and each weight's, the delayed
  // history's picks, inverse scales, one cast's inverse and scratch.
  EXPECT_EQ(staging, 4 * g.block_bytes(4) + 6 * 16 + 16 + 4 + static_cast<int64_t>(gpu::fp8_quantize_scratch_bytes(1)));
  EXPECT_EQ(on.gather_buffers, off.gather_buffers + staging);
}

struct GatherRun {
  testing::Trace trace;
  CommCounters counters;
  std::vector<std::vector<float>> history;  // train.fp8=delayed's
};

// steps of c at `world` ranks: rank 0's losses, every unit's parameters, its gather counters and its amax history.
GatherRun run(const Config& c, int world) {
  GatherRun out;
  fake::spawn(world, [&](Communicator& comm) {
    StepEngine e(c, comm);
    testing::Trace t;
    testing::train_steps(e, c, comm, kSeed, 0, c.train.steps, &t);
    t.params = e.gather_params();
    std::vector<std::vector<float>> history = e.sharded().fp8_history();
    if (comm.rank() == 0) out = {std::move(t), e.sharded().counters(), std::move(history)};
  });
  return out;
}

// The bytes rank 0 received over the run's gathers, from the plan: each gather of a unit, each segment's.
int64_t planned_gather_bytes(const Config& c, int world, const CommCounters& counters) {
  const std::vector<UnitLayout> units = build_units(c.model);
  int64_t bytes = 0;
  for (size_t u = 0; u < units.size(); ++u) bytes += counters.gathers[u] * unit_gather_bytes(c, units[u], world);
  return bytes;
}

// Training with the codes gathered gives the bits of training with fp32 gathered and cast after: losses and
// parameters equal, at 1 to 4 ranks, full and LoRA, tensorwise and delayed (whose weights the gathers cast by the
// history from the second step on, recording their maxima: the same history); and each gather received what the plan
// says.
TEST(Fp8GatherEngine, GivesTheBitsOfCastingAfterTheGather) {
  omp_set_num_threads(1);
  for (Fp8Recipe recipe : {Fp8Recipe::kTensorwise, Fp8Recipe::kDelayed})
    for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama})
      for (int lora : {0, 4})
        for (int world : {1, 2, 3, 4}) {
          SCOPED_TRACE(std::string(to_string(recipe)) + " " + to_string(arch) + " lora " + std::to_string(lora) +
                       " world " + std::to_string(world));
          Config off = tiny(arch, lora, recipe), on = off;
          on.dist.fp8_gather = true;
          const GatherRun want = run(off, world), got = run(on, world);
          EXPECT_EQ(got.trace.losses, want.trace.losses);
          EXPECT_EQ(got.trace.params, want.trace.params);
          EXPECT_EQ(got.history, want.history);
          if (recipe == Fp8Recipe::kDelayed) EXPECT_EQ(want.history.size(), static_cast<size_t>(off.train.steps));
          EXPECT_NE(want.trace.losses.back(), want.trace.losses.front());  // the steps trained
          EXPECT_EQ(got.counters.gathers, want.counters.gathers);
          EXPECT_EQ(want.counters.gathered_bytes, want.counters.gathered_elements * 4);
          EXPECT_EQ(got.counters.gathered_bytes, planned_gather_bytes(on, world, got.counters));
          EXPECT_LT(got.counters.gathered_bytes, want.counters.gathered_bytes);
        }
}

// dist.fp8_gather_keep: steps of c at `world` ranks, evaluating between them (evaluation casts afresh and keeps
// nothing): rank 0's losses and evaluation losses, parameters, history and gather counters.
struct KeptRun {
  GatherRun run;
  std::vector<float> evals;
};
KeptRun run_with_evals(const Config& c, int world) {
  KeptRun out;
  fake::spawn(world, [&](Communicator& comm) {
    StepEngine e(c, comm);
    testing::Trace t;
    std::vector<float> evals;
    for (int64_t step = 0; step < c.train.steps; ++step) {
      testing::train_steps(e, c, comm, kSeed, step, step + 1, &t);
      evals.push_back(e.evaluate(testing::corpus_batches(c, kSeed + 1, step, comm.world_size(), comm.rank()), 1));
    }
    t.params = e.gather_params();
    std::vector<std::vector<float>> history = e.sharded().fp8_history();
    if (comm.rank() == 0) out = {{std::move(t), e.sharded().counters(), std::move(history)}, std::move(evals)};
  });
  return out;
}

// Kept blocks train the bits of casting at every gather, tensorwise and delayed, with micro-steps, recompute and
// LoRA, at 1 to 3 ranks, and evaluations between the steps give the same losses; each training step's first gather
// of a unit casts and its later ones skip the maxima (the bytes step_traffic says: one full gather a unit a step).
TEST(Fp8GatherEngine, KeptBlocksTrainTheBitsOfCastingAtEveryGather) {
  omp_set_num_threads(1);
  for (Fp8Recipe recipe : {Fp8Recipe::kTensorwise, Fp8Recipe::kDelayed})
    for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama})
      for (const std::string variant : {"micro_steps", "recompute", "lora"})
        for (int world : {1, 3}) {
          SCOPED_TRACE(std::string(to_string(recipe)) + " " + to_string(arch) + " " + variant + " world " +
                       std::to_string(world));
          Config off = tiny(arch, variant == "lora" ? 4 : 0, recipe);
          off.dist.fp8_gather = true;
          off.train.global_batch = off.train.micro_batch * world * (variant == "micro_steps" ? 3 : 1);
          off.train.recompute = variant == "recompute";
          Config on = off;
          on.dist.fp8_gather_keep = true;
          const KeptRun want = run_with_evals(off, world), got = run_with_evals(on, world);
          EXPECT_EQ(got.run.trace.losses, want.run.trace.losses);
          EXPECT_EQ(got.run.trace.params, want.run.trace.params);
          EXPECT_EQ(got.run.history, want.run.history);
          EXPECT_EQ(got.evals, want.evals);
          EXPECT_NE(want.run.trace.losses.back(), want.run.trace.losses.front());  // the steps trained
          EXPECT_EQ(got.run.counters.gathers, want.run.counters.gathers);
          // What the evaluations' gathers received: every gather's bytes without keep, less the training steps'.
          const int64_t evaluated =
              want.run.counters.gathered_bytes - off.train.steps * step_traffic(off, world, world, false).gathered;
          EXPECT_EQ(got.run.counters.gathered_bytes,
                    off.train.steps * step_traffic(on, world, world, false).gathered + evaluated);
          EXPECT_LT(step_traffic(on, world, world, false).gathered, step_traffic(off, world, world, false).gathered);
        }
}

TEST(Fp8GatherConfig, KeepNeedsTheGatherAndThePlanCountsItsBlocks) {
  EXPECT_NE(testing::config_problem({"--train.fp8=tensorwise", "--dist.fp8_gather_keep=true"})
                .find("dist.fp8_gather_keep (true) keeps what dist.fp8_gather casts"),
            std::string::npos);
  Config c = tiny(ModelArch::kLlama);
  c.dist.fp8_gather = true;
  const MemoryPlan off = plan_host_memory(c, 3, 0);
  c.dist.fp8_gather_keep = true;
  const MemoryPlan on = plan_host_memory(c, 3, 0);
  const std::vector<UnitLayout> units = build_units(c.model);
  const Fp8GatherSegment g = fp8_gather_segment(c.model, units[1], false, 3, tensorwise());
  // Each block's segment: its block (codes and rest in fp32) and four inverse scales.
  EXPECT_EQ(fp8_gather_kept_bytes(c.model, units, 3, tensorwise(), 4), c.model.n_layer * (g.block_bytes(4) + 16));
  EXPECT_EQ(on.sharded_state, off.sharded_state + c.model.n_layer * (g.block_bytes(4) + 16));
  EXPECT_EQ(on.gather_buffers, off.gather_buffers);
}

}  // namespace
}  // namespace st
