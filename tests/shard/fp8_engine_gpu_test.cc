// train.fp8 on the CUDA backend (model/cuda_linear.h: cuBLASLt FP8 GEMMs on operands cast on the fly) against the
// CPU backend's emulation of the same casts, both families, both recipes (rowwise where cuBLASLt has per-row scales):
// in fp32, a step's loss within 1e-3 and every unit's gradients above 30 dB of the CPU's (the casts give the CPU's
// codes, and the GEMMs differ in accumulation only: the FP8 tensor cores keep about 13 mantissa bits between
// cuBLASLt's fp32 promotions); in bf16, the loss within 2e-2 and the gradients above 20 dB (torchao's floor for FP8
// against its reference). Training in FP8 tracks bf16's losses within 1% over four steps; recompute repeats the same
// bits; LoRA's adapters train on an FP8 base as on the CPU; optimizer offload trains what the device optimizer does.
// dist.fp8_gather (the weights gathered as E4M3 codes, which the GEMMs read in place; tensorwise and delayed) trains
// the bits of casting after the gather, in fp32 and bf16, full, LoRA, with recompute and with the parameters offloaded,
// and each gather receives what its plan (shard/fp8_gather.h) says. train.fp8_fast_accum's forward GEMMs train as bf16
// does too.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../common/fp8_gpu_test.h"
#include "../common/fp8_tiny.h"
#include "../common/snr.h"
#include "../common/tiny_training.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/kernels/gpu/fp8_gemm.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/step_traffic.h"
#include "shardtrain/train/step_engine.h"

namespace st {
namespace {

constexpr uint64_t kSeed = 5;

std::vector<Fp8Recipe> recipes() {
  if (test::rowwise_fp8_here()) return {Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise};
  return {Fp8Recipe::kTensorwise};
}

testing::Trace train(const Config& c, int64_t steps, bool grads = false) {
  SoloCommunicator solo;
  return testing::train(c, solo, kSeed, steps, grads);
}

TEST(Fp8Cuda, AStepMatchesTheCpusEmulation) {
  ST_SKIP_WITHOUT_FP8();
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama})
    for (Fp8Recipe recipe : recipes()) {
      SCOPED_TRACE(std::string(to_string(arch)) + " " + to_string(recipe));
      const testing::Trace cpu = train(testing::fp8_tiny(arch, recipe), 1, true);
      const testing::Trace gpu = train(testing::fp8_tiny(arch, recipe, Device::kCuda, DType::kF32), 1, true);
      const testing::Trace half = train(testing::fp8_tiny(arch, recipe, Device::kCuda, DType::kBF16), 1, true);
      EXPECT_NEAR(gpu.losses[0], cpu.losses[0], 1e-3 * cpu.losses[0]);
      EXPECT_NEAR(half.losses[0], cpu.losses[0], 2e-2 * cpu.losses[0]);
      for (size_t u = 0; u < cpu.grads0.size(); ++u) {
        EXPECT_GT(testing::snr_db(cpu.grads0[u], gpu.grads0[u]), 30.0) << "fp32, unit " << u;
        EXPECT_GT(testing::snr_db(cpu.grads0[u], half.grads0[u]), 20.0) << "bf16, unit " << u;
      }
    }
}

TEST(Fp8Cuda, TrainsAsBf16DoesAndRecomputeRepeatsTheBits) {
  ST_SKIP_WITHOUT_FP8();
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    SCOPED_TRACE(to_string(arch));
    const testing::Trace ref = train(testing::fp8_tiny(arch, Fp8Recipe::kOff, Device::kCuda, DType::kBF16), 4);
    for (Fp8Recipe recipe : recipes()) {
      Config c = testing::fp8_tiny(arch, recipe, Device::kCuda, DType::kBF16), r = c;
      r.train.recompute = true;
      Config first = r;  // all blocks but the last recompute: the last keeps its codes from the one forward
      first.train.recompute_blocks = first.model.n_layer - 1;
      ASSERT_GE(first.model.n_layer, 2);
      const testing::Trace got = train(c, 4), again = train(r, 4), partly = train(first, 4);
      for (size_t i = 0; i < ref.losses.size(); ++i)
        EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-2 * ref.losses[i]) << to_string(recipe) << " step " << i;
      EXPECT_NE(got.losses, ref.losses);  // the casts are on
      EXPECT_EQ(again.losses, got.losses) << to_string(recipe) << " with recompute";
      EXPECT_EQ(again.params, got.params) << to_string(recipe) << " with recompute";
      EXPECT_EQ(partly.losses, got.losses) << to_string(recipe) << " with all blocks but the last recomputed";
      EXPECT_EQ(partly.params, got.params) << to_string(recipe) << " with all blocks but the last recomputed";
    }
  }
}

// train.fp8_fast_accum: the forward GEMMs without cuBLASLt's promotions train as bf16 does, within 1% over four
// steps, for both recipes and families.
TEST(Fp8Cuda, FastAccumulationTrainsAsBf16Does) {
  ST_SKIP_WITHOUT_FP8();
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    const testing::Trace ref = train(testing::fp8_tiny(arch, Fp8Recipe::kOff, Device::kCuda, DType::kBF16), 4);
    for (Fp8Recipe recipe : recipes()) {
      SCOPED_TRACE(std::string(to_string(arch)) + " " + to_string(recipe));
      Config c = testing::fp8_tiny(arch, recipe, Device::kCuda, DType::kBF16);
      c.train.fp8_fast_accum = true;
      const testing::Trace got = train(c, 4);
      for (size_t i = 0; i < ref.losses.size(); ++i) EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-2 * ref.losses[i]);
    }
  }
}

// The frozen base's GEMMs in FP8 (no weight gradient), the adapters' in the compute type: the adapters' gradients as
// the CPU's emulation computes them, for a bf16 and an NF4 base.
TEST(Fp8Cuda, LoraTrainsItsAdaptersOnAnFp8BaseAsTheCpuDoes) {
  ST_SKIP_WITHOUT_FP8();
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama})
    for (LoraBase base : {LoraBase::kBf16, LoraBase::kNf4}) {
      SCOPED_TRACE(std::string(to_string(arch)) + " " + to_string(base));
      Config cpu_cfg = testing::fp8_tiny(arch, Fp8Recipe::kTensorwise);
      cpu_cfg.model.lora.rank = 4;
      cpu_cfg.model.lora.base_dtype = base;
      Config gpu_cfg = cpu_cfg;
      gpu_cfg.train.device = Device::kCuda;
      const testing::Trace cpu = train(cpu_cfg, 1, true), gpu = train(gpu_cfg, 1, true);
      EXPECT_NEAR(gpu.losses[0], cpu.losses[0], 1e-3 * cpu.losses[0]);
      for (size_t u = 0; u < cpu.grads0.size(); ++u)
        if (!cpu.grads0[u].empty()) EXPECT_GT(testing::snr_db(cpu.grads0[u], gpu.grads0[u]), 30.0) << "unit " << u;
    }
}

// Optimizer offload under FP8: the host AdamW trains what the device AdamW trains, bit for bit, whether the host also
// holds the compute parameters (uploaded to other buffers for the backward than for the forward: the backward's casts
// take the maxima its forward kept by layer and weight, not by address). 12 micro-batches a step: the gradients
// accumulate across FP8 backwards.
TEST(Fp8Cuda, OffloadTrainsWhatTheDeviceOptimizerTrains) {
  ST_SKIP_WITHOUT_FP8();
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama})
    for (Fp8Recipe recipe : recipes()) {
      SCOPED_TRACE(std::string(to_string(arch)) + " " + to_string(recipe));
      const Config base = testing::fp8_tiny(arch, recipe, Device::kCuda, DType::kBF16);
      ASSERT_EQ(base.train.global_batch / base.train.micro_batch, 12);
      const testing::Trace want = train(base, 3);
      for (OffloadMode mode : {OffloadMode::kOptimizer, OffloadMode::kOptimizerParams}) {
        Config c = base;
        c.optim.offload = mode;
        c.optim.offload_threads = 2;
        const testing::Trace got = train(c, 3);
        EXPECT_EQ(got.losses, want.losses) << to_string(mode);
        EXPECT_EQ(got.params, want.params) << to_string(mode);
      }
    }
}

// Steps of c on one GPU: the trace, the bytes its gathers received, against what the plan says of them, and the amax
// history of train.fp8=delayed.
struct Gathered {
  testing::Trace trace;
  int64_t bytes = 0, planned = 0;
  std::vector<std::vector<float>> history;
};
Gathered train_counting(const Config& c, int64_t steps) {
  SoloCommunicator solo;
  StepEngine e(c, solo);
  Gathered g;
  testing::train_steps(e, c, solo, kSeed, 0, steps, &g.trace);
  g.trace.params = e.gather_params();
  const CommCounters& n = e.sharded().counters();
  g.bytes = n.gathered_bytes;
  const std::vector<UnitLayout> units = build_units(c.model);
  for (size_t u = 0; u < units.size(); ++u) g.planned += n.gathers[u] * unit_gather_bytes(c, units[u], 1);
  g.history = e.sharded().fp8_history();
  return g;
}

// Under delayed the gathers cast the weights by the history from the second step on and record their maxima: the
// same history, and the same bits.
TEST(Fp8Cuda, GatheredCodesTrainTheBitsOfCastingAfterTheGather) {
  ST_SKIP_WITHOUT_FP8();
  for (Fp8Recipe recipe : {Fp8Recipe::kTensorwise, Fp8Recipe::kDelayed})
    for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama})
      for (DType dtype : {DType::kF32, DType::kBF16})
        for (const char* variant : {"full", "lora", "recompute", "offload"}) {
          // optim.offload takes a half-precision compute type on cuda (the config refuses fp32).
          if (std::string(variant) == "offload" && dtype == DType::kF32) continue;
          SCOPED_TRACE(std::string(to_string(recipe)) + " " + to_string(arch) + " " + to_string(dtype) + " " + variant);
          Config off = testing::fp8_tiny(arch, recipe, Device::kCuda, dtype);
          off.train.steps = 3;
          if (std::string(variant) == "lora") off.model.lora.rank = 4;
          if (std::string(variant) == "recompute") off.train.recompute = true;
          if (std::string(variant) == "offload") {
            off.optim.offload = OffloadMode::kOptimizerParams;
            off.optim.offload_threads = 2;
          }
          Config on = off;
          on.dist.fp8_gather = true;
          const Gathered want = train_counting(off, 3), got = train_counting(on, 3);
          EXPECT_EQ(got.trace.losses, want.trace.losses);
          EXPECT_EQ(got.trace.params, want.trace.params);
          EXPECT_EQ(got.history, want.history);
          EXPECT_EQ(want.bytes, want.planned);
          EXPECT_EQ(got.bytes, got.planned);
          EXPECT_LT(got.bytes, want.bytes);
        }
}

// dist.fp8_gather_keep on one GPU: steps of c with an evaluation after each (which casts afresh); the trace, the
// evaluations, the history and the bytes the gathers received.
struct Kept {
  Gathered run;
  std::vector<float> evals;
};
Kept train_kept(const Config& c, int64_t steps) {
  SoloCommunicator solo;
  StepEngine e(c, solo);
  Kept k;
  for (int64_t step = 0; step < steps; ++step) {
    testing::train_steps(e, c, solo, kSeed, step, step + 1, &k.run.trace);
    k.evals.push_back(e.evaluate(testing::corpus_batches(c, kSeed + 1, step), 1));
  }
  k.run.trace.params = e.gather_params();
  k.run.bytes = e.sharded().counters().gathered_bytes;
  k.run.history = e.sharded().fp8_history();
  return k;
}

// Kept blocks train the bits of casting at every gather, tensorwise and delayed, bf16, with micro-steps, recompute
// and the parameters offloaded; the evaluations between the steps give the same losses; each step's first gather of
// a unit casts and its later ones skip the maxima (step_traffic's bytes).
TEST(Fp8Cuda, KeptBlocksTrainTheBitsOfCastingAtEveryGather) {
  ST_SKIP_WITHOUT_FP8();
  for (Fp8Recipe recipe : {Fp8Recipe::kTensorwise, Fp8Recipe::kDelayed})
    for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama})
      for (const std::string variant : {"micro_steps", "recompute", "offload"}) {
        SCOPED_TRACE(std::string(to_string(recipe)) + " " + to_string(arch) + " " + variant);
        Config off = testing::fp8_tiny(arch, recipe, Device::kCuda, DType::kBF16);
        off.train.steps = 3;
        off.dist.fp8_gather = true;
        off.train.global_batch = off.train.micro_batch * (variant == "micro_steps" ? 3 : 1);
        off.train.recompute = variant == "recompute";
        if (variant == "offload") {
          off.optim.offload = OffloadMode::kOptimizerParams;
          off.optim.offload_threads = 2;
        }
        Config on = off;
        on.dist.fp8_gather_keep = true;
        const Kept want = train_kept(off, 3), got = train_kept(on, 3);
        EXPECT_EQ(got.run.trace.losses, want.run.trace.losses);
        EXPECT_EQ(got.run.trace.params, want.run.trace.params);
        EXPECT_EQ(got.run.history, want.run.history);
        EXPECT_EQ(got.evals, want.evals);
        EXPECT_EQ(want.run.bytes - got.run.bytes,
                  3 * (step_traffic(off, 1, 1, false).gathered - step_traffic(on, 1, 1, false).gathered));
        EXPECT_LT(got.run.bytes, want.run.bytes);
      }
}

}  // namespace
}  // namespace st
