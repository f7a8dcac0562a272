// The host plans are host arithmetic: each term is checked against GPT-2 124M's unit sizes
// (plan_test_shapes.h) and Llama-3.1-8B's (8,030,261,248 parameters).
#include "shardtrain/shard/host_plan.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../common/caught.h"
#include "plan_test_shapes.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/model/decoder_stage.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/memory_plan.h"
#include "shardtrain/shard/shard_span.h"

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
  const HostPlan p = plan_cuda_host(gpt2_124m(DType::kBF16), 1, 0);
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
  const HostPlan p = plan_cuda_host(c, 1, 0);
  EXPECT_EQ(p.optimizer_state, 12 * kParams);
  // Two of the largest unit's gradient (fp32) and result (bf16), each rounded up to 4 KiB.
  EXPECT_EQ(p.staging, 2 * (align4k(4 * kEmbedding) + align4k(2 * kEmbedding)));
  EXPECT_EQ(p.host_parameters, 0);  // on the device
  EXPECT_EQ(p.speculative, 0);
  // Speculation: the second state, and a gradient and result buffer for every unit.
  const HostPlan spec = plan_cuda_host(c, 1, kEveryOffloadedUnit);
  EXPECT_EQ(spec.speculative, 12 * kParams);
  EXPECT_EQ(spec.staging, (4 + 2) * kParams);
  // Parameters on the host: their pinned bf16 copy, and a ring for the gradients alone.
  c.optim.offload = OffloadMode::kOptimizerParams;
  c.train.dtype = DType::kF16;
  EXPECT_EQ(plan_cuda_host(c, 1, 0).host_parameters, 2 * kParams);
  EXPECT_EQ(plan_cuda_host(c, 1, 0).staging, 2 * align4k(4 * kEmbedding));
  EXPECT_EQ(plan_cuda_host(c, 1, kEveryOffloadedUnit).host_parameters,
            0);  // the result buffers are the copy gathers read
}

TEST(HostPlan, OffloadFractionAndWorldSizeShrinkTheHostState) {
  Config c = gpt2_124m(DType::kBF16);
  c.optim.offload = OffloadMode::kOptimizer;
  c.optim.offload_fraction = 0.5f;  // the final LayerNorm and nine blocks (memory_plan_test.cc)
  const int64_t on_host = 1536 + 9 * kBlock, on_device = kParams - on_host;
  const HostPlan p = plan_cuda_host(c, 1, 0);
  EXPECT_EQ(p.optimizer_state, 12 * on_host);
  EXPECT_EQ(p.staging, 2 * (align4k(4 * kBlock) + align4k(2 * kBlock)));  // the largest offloaded unit: a block
  // A background checkpoint copies the device-resident units' param, m and v; offloaded ones are written in place.
  c.ckpt.dir = "ck";
  EXPECT_EQ(plan_cuda_host(c, 1, 0).snapshot, 12 * on_device);
  c.ckpt.async = false;
  EXPECT_EQ(plan_cuda_host(c, 1, 0).snapshot, 0);
  // Two ranks: every unit of GPT-2 124M divides evenly.
  c.ckpt.dir.clear();
  EXPECT_EQ(plan_cuda_host(c, 2, 0).optimizer_state, 12 * on_host / 2);
}

TEST(HostPlan, LoadingCountsTheHostViewOfOneUnit) {
  Config c = gpt2_124m(DType::kBF16);
  c.optim.offload = OffloadMode::kOptimizer;
  c.optim.offload_fraction = 0.5f;                             // the embedding and three blocks stay on the device
  EXPECT_EQ(plan_cuda_host(c, 1, 0).loading, 4 * kEmbedding);  // random init, the largest shard
  // init.from streams the device-resident units through the host one at a time: the largest is the embedding.
  c.init.from = "gpt2.safetensors";
  EXPECT_EQ(plan_cuda_host(c, 1, 0).loading, 12 * kEmbedding + kStreamingIoBytes);
  c.init.from.clear();
  c.ckpt.dir = "ck";  // a resume, and synchronous saves, stream the same way
  EXPECT_EQ(plan_cuda_host(c, 1, 0).loading, 12 * kEmbedding + kStreamingIoBytes);
  EXPECT_EQ(plan_cuda_host(c, 2, 0).loading, 12 * kEmbedding / 2 + kStreamingIoBytes);  // its shard
  // Without offload the same unit is in hand: not the whole model's 12 bytes a parameter.
  c.optim.offload = OffloadMode::kNone;
  EXPECT_EQ(plan_cuda_host(c, 1, 0).loading, 12 * kEmbedding + kStreamingIoBytes);
  c.optim.offload = OffloadMode::kOptimizer;
  c.optim.offload_fraction = 1.0f;  // nothing device-resident: offloaded units are read and written in place
  EXPECT_EQ(plan_cuda_host(c, 1, 0).loading, 4 * kEmbedding);
}

TEST(HostPlan, Llama8BWithOptimizerOffloadOnOneRank) {
  const Config c = llama31_8b();
  const HostPlan p = plan_cuda_host(c, 1, 0);
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
  EXPECT_EQ(plan_cuda_host(with_ckpt, 1, 0).total(), p.total());
}

TEST(HostPlan, SpeculatedUnitsAreTheLastOffloadedOnes) {
  const std::vector<bool> off{false, true, true, true};
  EXPECT_EQ(speculated_units(off, 0), std::vector<bool>(4, false));
  EXPECT_EQ(speculated_units(off, 2), (std::vector<bool>{false, false, true, true}));
  EXPECT_EQ(speculated_units(off, kEveryOffloadedUnit), off);
  EXPECT_EQ(speculated_units(std::vector<bool>(3, false), kEveryOffloadedUnit), std::vector<bool>(3, false));
}

// Some units speculate: their second copies and buffers, and the ring for the others, sized by the largest of them.
TEST(HostPlan, PartialSpeculationPlansTheSecondCopyOfTheLastUnitsAndTheRingForTheRest) {
  Config c = gpt2_124m(DType::kBF16);
  c.optim.offload = OffloadMode::kOptimizer;
  const std::vector<UnitLayout> units = build_units(c.model);
  const int n = static_cast<int>(units.size());
  ASSERT_EQ(speculated_units(offloaded_units(c, units), 2).back(), true);
  const int64_t last_two =
      padded_shard_size(units[units.size() - 1].numel, 1) + padded_shard_size(units[units.size() - 2].numel, 1);
  const HostPlan p = plan_cuda_host(c, 1, 2);
  EXPECT_EQ(p.offloaded_units, n);
  EXPECT_EQ(p.speculated_units, 2);
  EXPECT_EQ(p.optimizer_state, 12 * kParams);
  EXPECT_EQ(p.speculative, 12 * last_two);
  EXPECT_EQ(p.staging, (4 + 2) * last_two + 2 * (align4k(4 * kEmbedding) + align4k(2 * kEmbedding)));
  EXPECT_NE(
      p.breakdown().find(str_cat("speculative copy ", format_gib(12 * last_two), " (2 of ", n, " offloaded units)")),
      std::string::npos)
      << p.breakdown();
  EXPECT_EQ(plan_cuda_host(c, 1, kEveryOffloadedUnit).speculated_units, n);
  EXPECT_EQ(plan_cuda_host(c, 1, kEveryOffloadedUnit).breakdown().find("offloaded units)"), std::string::npos);
  // Parameters on the host: the units that do not speculate keep their pinned copy.
  c.optim.offload = OffloadMode::kOptimizerParams;
  EXPECT_EQ(plan_cuda_host(c, 1, 2).host_parameters, 2 * (kParams - last_two));
}

// auto speculates as many of the last units as the budget holds: the plan of its count fits, one more does not.
TEST(HostPlan, AutoSpeculatesTheLastUnitsThatFit) {
  Config c = gpt2_124m(DType::kBF16);
  c.optim.offload = OffloadMode::kOptimizer;
  const int n = plan_cuda_host(c, 1, 0).offloaded_units;
  const int64_t with = plan_cuda_host(c, 1, kEveryOffloadedUnit).total(), without = plan_cuda_host(c, 1, 0).total();
  EXPECT_EQ(resolve_speculation(c, 1, budget_of(with)), n);
  int partial = 0;
  for (int64_t budget = without; budget < with; budget += (with - without) / 16) {
    const int k = resolve_speculation(c, 1, budget_of(budget));
    SCOPED_TRACE(::testing::Message() << format_gib(budget) << ": " << k << " units");
    ASSERT_GE(k, 0);
    ASSERT_LT(k, n);
    if (k > 0) EXPECT_LE(plan_cuda_host(c, 1, k).total(), budget);
    EXPECT_GT(plan_cuda_host(c, 1, k + 1).total(), budget);
    partial += k > 0;
  }
  EXPECT_GT(partial, 8) << "budgets between the plans without and with the second copy speculate some units";
  EXPECT_EQ(resolve_speculation(c, 1, budget_of(without - 1)), 0);
  c.optim.offload_speculative = Speculation::kOff;
  EXPECT_EQ(resolve_speculation(c, 1, budget_of(1000 * kGiB)), 0);
  c.optim.offload_speculative = Speculation::kOn;
  EXPECT_EQ(resolve_speculation(c, 1, budget_of(0)), n);
  // true that does not fit: auto would speculate what does.
  const int64_t half = (with + without) / 2;
  Config a = c;
  a.optim.offload_speculative = Speculation::kAuto;
  const int k = resolve_speculation(a, 1, budget_of(half));
  ASSERT_GT(k, 0);
  EXPECT_NE(refusal(c, half).find(str_cat("it fits with optim.offload_speculative=auto (", k, " of the ", n,
                                          " offloaded units speculate)")),
            std::string::npos)
      << refusal(c, half);
  c.optim.offload = OffloadMode::kNone;
  EXPECT_EQ(resolve_speculation(c, 1, budget_of(1000 * kGiB)), 0);
}

TEST(HostPlan, RefusalGivesTheBreakdownTheLimitAndWhatFits) {
  Config c = llama31_8b();
  c.optim.offload = OffloadMode::kOptimizerParams;
  const HostPlan p = plan_cuda_host(c, 1, 0);
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

// generate's host plan at Llama-3.2-1B: 262,668,288 embedding elements, 16 blocks of 60,821,504, the final norm's
// 2,048 (tied head): 1,235,814,400 in all.
constexpr int64_t k1bEmbedding = 262668288, k1bBlock = 60821504, k1bParams = 1235814400;

// On the CPU the decoder is its fp32 footprint (no runtime term) and keeps the buffers the load reads into: the load
// adds only the file reads' buffers.
TEST(DecoderHostPlan, TheCpuDecoderIsItsFp32FootprintAndKeepsWhatTheLoadReads) {
  Config c = llama_1b();
  c.train.device = Device::kCpu;
  c.train.dtype = DType::kF32;
  const DecoderHostPlan p = plan_decoder_host(c, 2);
  EXPECT_EQ(p.decoder_parts.weights, 4 * k1bParams);
  EXPECT_EQ(p.decoder_parts.cache, 2 * 4 * 16 * 2 * int64_t{2048} * 512);  // k and v, fp32, 16 layers, 2 x 2048 rows
  EXPECT_EQ(p.decoder_parts.runtime, 0);
  const DecoderFootprint f = decoder_footprint(c.model, DType::kF32, 2);
  EXPECT_EQ(p.decoder, f.weights + f.cache + f.activations);
  EXPECT_EQ(p.loading, kStreamingIoBytes);
  EXPECT_EQ(p.upload, 0);
  EXPECT_EQ(p.reserve, kHostReserveBytes);
  EXPECT_EQ(p.total(), p.decoder + kStreamingIoBytes + kHostReserveBytes);
  // A stage of a split holds its units alone: the second half of two holds blocks 8-15, the head and the tied
  // classifier's copy of the embedding.
  const std::vector<UnitRange> halves = split_units(c.model, 2, 2);
  const DecoderHostPlan second = plan_decoder_host(c, 2, DecoderStage{1, 2, halves[1], nullptr});
  EXPECT_EQ(second.decoder_parts.weights, 4 * (k1bEmbedding + 8 * k1bBlock + 2048));
  EXPECT_EQ(second.decoder_parts.cache, p.decoder_parts.cache / 2);
}

// On cuda the host holds no decoder: two of the largest unit's fp32 buffers (the unit read, and the one before while
// the buffer grows to it), the file reads' buffers, two pinned chunks of 2^23 bf16 elements (and, split, the rows
// passed between ranks), and the CUDA runtime's reserve.
TEST(DecoderHostPlan, OnCudaTheHostHoldsTwoUnitBuffersAndTwoPinnedChunks) {
  const Config c = llama_1b();
  const DecoderHostPlan p = plan_decoder_host(c, 16);
  EXPECT_EQ(p.decoder, 0);
  EXPECT_EQ(p.loading, 2 * 4 * k1bEmbedding + kStreamingIoBytes);
  EXPECT_EQ(p.upload, int64_t{32} << 20);
  EXPECT_EQ(p.reserve, kCudaHostReserveBytes);
  EXPECT_EQ(plan_decoder_host(c, 1).total(), p.total());  // the sequences live on the device
  // The first stage of a 2-way split of a 4-layer untied model holds the embedding and two blocks: its largest unit is
  // still the embedding; the second stage's, the head's lm_head.
  Config untied = llama(4, 2048, 8192, false);
  const std::vector<UnitRange> halves = split_units(untied.model, 1, 2);
  const DecoderHostPlan first = plan_decoder_host(untied, 1, DecoderStage{0, 2, halves[0], nullptr});
  EXPECT_EQ(first.loading, 2 * 4 * k1bEmbedding + kStreamingIoBytes);
  const DecoderHostPlan last = plan_decoder_host(untied, 1, DecoderStage{1, 2, halves[1], nullptr});
  EXPECT_EQ(last.loading, 2 * 4 * (k1bEmbedding + 2048) + kStreamingIoBytes);
  // A split stage also pins the rows it passes on: max(seq_len, batch) rows of n_embd in the compute type.
  EXPECT_EQ(first.upload, (int64_t{32} << 20) + untied.model.seq_len * 2048 * 2);
  EXPECT_EQ(last.upload, first.upload);
}

// A LoRA checkpoint is read whole (its held units with their adapters), then each unit is merged as it is handed over:
// the CPU decoder keeps the merged units as the full ones are freed; cuda uploads each, one merged unit at a time. Rank
// 16 on every linear layer adds, a block: q 16 x (2048 + 2048), k and v 16 x (2048 + 512) each, o 16 x (2048 + 2048),
// gate and up 16 x (2048 + 8192) each, down 16 x (8192 + 2048): 704,512 elements.
TEST(DecoderHostPlan, ALoraCheckpointIsReadWholeAndThenMerged) {
  Config c = llama_1b();
  c.model.lora.rank = 16;
  const int64_t whole = 4 * (k1bParams + 16 * 704512);
  EXPECT_EQ(plan_decoder_host(c, 1).loading, whole + 4 * k1bEmbedding + kStreamingIoBytes);
  c.train.device = Device::kCpu;
  c.train.dtype = DType::kF32;
  const DecoderHostPlan cpu = plan_decoder_host(c, 1);
  EXPECT_EQ(cpu.loading, whole - 4 * k1bParams + 4 * k1bEmbedding + kStreamingIoBytes);  // the adapters, a unit
  EXPECT_EQ(cpu.decoder_parts.weights, 4 * k1bParams);  // the merged model, without adapters
}

// The plan against the host's budget: its total passes; a byte less is refused with the breakdown, the limit that
// binds and what to change, which differs between the devices.
TEST(DecoderHostPlan, APlanPastTheBudgetIsRefusedWithItsBreakdown) {
  Config c = llama_1b();
  c.train.device = Device::kCpu;
  c.train.dtype = DType::kF32;
  const DecoderHostPlan p = plan_decoder_host(c, 2);
  EXPECT_NO_THROW(check_decoder_host_memory(c, 2, {}, budget_of(p.total())));
  const Error e = testing::caught([&] { check_decoder_host_memory(c, 2, {}, budget_of(p.total() - 1)); });
  EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
  const std::string want = "host memory: generate on cpu with 2 sequence(s) of 2048 positions needs " +
                           format_gib(p.total()) + " (decoder " + format_gib(p.decoder) + " (weights 4.60 GiB, " +
                           "key/value caches 0.25 GiB, activations " + format_gib(p.decoder_parts.activations) +
                           "), loading 0.25 GiB, reserve 0.25 GiB; total " + format_gib(p.total()) +
                           "), but a test budget of " + format_gib(p.total() - 1) +
                           "; lower generate's --batch or model.seq_len, decode on a GPU (--train.device=cuda), or "
                           "split the layers over more hosts (--split layers under mpirun)";
  EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  const Config gpu = llama_1b();
  const Error g = testing::caught([&] { check_decoder_host_memory(gpu, 4, {}, budget_of(kGiB)); });
  EXPECT_NE(std::string(g.what()).find("host memory: generate on cuda needs " +
                                       format_gib(plan_decoder_host(gpu, 4).total()) + " (loading 2.21 GiB, upload " +
                                       "0.03 GiB, reserve 3.00 GiB; total "),
            std::string::npos)
      << g.what();
  EXPECT_NE(std::string(g.what()).find("; free host memory, or run fewer ranks on this host"), std::string::npos)
      << g.what();
}

// ckpt.export gathers each unit whole on every rank at the end of the run and the lead writes it: the largest unit,
// and with LoRA its frozen base joined to its adapters or merged beside it (8 bytes an element), beside the writer's
// buffers. It never runs beside a load, so the larger of the two counts on cuda; the CPU plan adds it to the state
// that stays allocated.
TEST(HostPlan, ExportCountsTheLargestUnitGatheredWhole) {
  Config c = gpt2_124m(DType::kBF16);
  EXPECT_EQ(export_host_bytes(c, 1), 0);
  c.ckpt.export_path = "final";
  EXPECT_EQ(export_host_bytes(c, 1), 4 * kEmbedding + kStreamingIoBytes);
  EXPECT_EQ(export_host_bytes(c, 2), 4 * kEmbedding + kStreamingIoBytes);  // every rank gathers the whole unit
  const HostPlan p = plan_cuda_host(c, 1, 0);
  EXPECT_EQ(p.loading, 4 * kEmbedding);
  EXPECT_EQ(p.export_unit, 4 * kEmbedding + kStreamingIoBytes);
  EXPECT_EQ(p.total(), 4 * kEmbedding + kStreamingIoBytes + kCudaHostReserveBytes);
  EXPECT_NE(p.breakdown().find(", loading 0.15 GiB, export 0.40 GiB (the larger of loading and export counts)"),
            std::string::npos)
      << p.breakdown();
  Config lora = llama_1b();
  lora.model.lora.rank = 16;
  lora.ckpt.export_path = "final";
  EXPECT_EQ(export_host_bytes(lora, 1), 8 * k1bEmbedding + kStreamingIoBytes);  // the embedding has no adapters
  Config cpu = gpt2_124m(DType::kF32);
  cpu.train.device = Device::kCpu;
  const int64_t without = plan_host_memory(cpu, 1, 0).total();
  cpu.ckpt.export_path = "final";
  const MemoryPlan m = plan_host_memory(cpu, 1, 0);
  EXPECT_EQ(m.export_unit, 4 * kEmbedding + kStreamingIoBytes);
  EXPECT_EQ(m.total(), without + m.export_unit);
}

// The end-of-run sample beside the training state: on cuda the bf16 decoder of one sequence on the device, and on the
// host the largest gathered unit (the embedding), its merged copy with LoRA and the two pinned chunks; on the CPU the
// fp32 decoder on the host, which keeps each gathered buffer (with LoRA the gathered unit beside its merged copy).
TEST(SampleFootprint, TheDecoderBesideTheTrainingState) {
  Config c = llama_1b();
  const SampleFootprint gpu = sample_footprint(c);
  EXPECT_EQ(gpu.device, decoder_footprint(c.model, DType::kBF16, 1).total());
  EXPECT_EQ(gpu.host, 4 * k1bEmbedding + (int64_t{32} << 20));
  c.model.lora.rank = 16;
  const SampleFootprint lora = sample_footprint(c);
  EXPECT_EQ(lora.device, gpu.device);                                // the merged model's decoder
  EXPECT_EQ(lora.host, 2 * 4 * k1bEmbedding + (int64_t{32} << 20));  // the embedding has no adapters
  c.train.device = Device::kCpu;
  c.train.dtype = DType::kF32;
  DecoderFootprint cpu = decoder_footprint(base_model(c.model), DType::kF32, 1);
  EXPECT_EQ(sample_footprint(c).device, 0);
  EXPECT_EQ(sample_footprint(c).host, cpu.weights + cpu.cache + cpu.activations + 4 * k1bEmbedding);
  c.model.lora.rank = 0;
  EXPECT_EQ(sample_footprint(c).host, cpu.weights + cpu.cache + cpu.activations);
}

// What fits passes ("" back); the device is judged first, then the host, each message naming the need and the limit.
TEST(SampleFootprint, AMisfitSaysWhichMemoryAndHowMuch) {
  const Config c = llama_1b();
  const SampleFootprint f = sample_footprint(c);
  EXPECT_EQ(sample_misfit(c, f.device, budget_of(f.host)), "");
  EXPECT_EQ(sample_misfit(c, f.device - 1, budget_of(0)), "its decoder needs " + format_gib(f.device) +
                                                              " of device memory beside the training state, " +
                                                              format_gib(f.device - 1) + " are free");
  EXPECT_EQ(sample_misfit(c, f.device, budget_of(f.host - 1)),
            "its decoder needs " + format_gib(f.host) + " of host memory beside the training state, but a test " +
                "budget of " + format_gib(f.host - 1));
}

}  // namespace
}  // namespace st
