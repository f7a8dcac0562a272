// train.fp8 on the CPU backend, whose linear layers emulate FP8 GEMMs (model/cpu_linear.h): the policy's table, a
// step's gradients against fp32 by signal-to-noise ratio (torchao's measure) for both recipes and families, the
// training it does tracks fp32's, and N ranks give one rank's result (the casts are per micro-batch and
// deterministic).
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "../ckpt/ckpt_test_util.h"
#include "../common/config_problem.h"
#include "../common/fp8_tiny.h"
#include "../common/rank_equivalence.h"
#include "../common/snr.h"
#include "../common/temp_dir.h"
#include "../common/tiny_training.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/fp8_policy.h"
#include "shardtrain/train/step_engine.h"

namespace st {
namespace {

constexpr uint64_t kSeed = 5;

// 8 tokens a micro-batch (the weight gradients in fp32) where a test trains for several steps or across world sizes:
// the loss falls over 4 steps there, and N ranks stay within 1e-4 of one; the one-step test takes 16 (every GEMM FP8).
Config tiny(ModelArch arch, Fp8Recipe fp8, int64_t seq_len = 8) {
  return testing::fp8_tiny(arch, fp8, Device::kCpu, DType::kF32, seq_len);
}

// train.fp8 is a config key both backends take; cuda refuses it with fp16 compute (FP8 GEMMs write bf16 or fp32).
// train.fp8_fast_accum is cuda's alone.
TEST(Fp8Policy, TheKeyIsTakenAndFp16IsRefused) {
  const auto problem = testing::config_problem;
  EXPECT_EQ(problem({"--train.fp8=rowwise"}), "");
  EXPECT_EQ(problem({"--train.fp8=tensorwise", "--train.device=cuda", "--train.dtype=bf16"}), "");
  EXPECT_NE(problem({"--train.fp8=tensorwise", "--train.device=cuda", "--train.dtype=fp16"})
                .find("train.fp8 (tensorwise) needs train.dtype bf16 or fp32"),
            std::string::npos);
  EXPECT_NE(problem({"--train.fp8=e4m3"}).find("train.fp8"), std::string::npos);
  // Fast accumulation is the cuda FP8 GEMMs': refused without train.fp8 and on the cpu backend.
  EXPECT_EQ(problem({"--train.fp8=tensorwise", "--train.fp8_fast_accum=true", "--train.device=cuda"}), "");
  EXPECT_NE(problem({"--train.fp8_fast_accum=true", "--train.device=cuda"})
                .find("train.fp8_fast_accum (true) applies to the FP8 GEMMs: set train.fp8"),
            std::string::npos);
  EXPECT_NE(problem({"--train.fp8=rowwise", "--train.fp8_fast_accum=true"})
                .find("train.fp8_fast_accum (true) applies to train.device=cuda"),
            std::string::npos);
}

TEST(Fp8Policy, NamesEachGemmsOperandsAndWhereItApplies) {
  const Fp8Policy off = fp8_policy(Fp8Recipe::kOff), t = fp8_policy(Fp8Recipe::kTensorwise),
                  r = fp8_policy(Fp8Recipe::kRowwise);
  EXPECT_FALSE(off.applies(64, 64));
  EXPECT_TRUE(t.applies(64, 48));
  EXPECT_FALSE(t.applies(64, 40));  // 40 is not a multiple of 16
  EXPECT_FALSE(r.applies(24, 64));
  EXPECT_TRUE(t.weight_grad_applies(32));
  EXPECT_FALSE(t.weight_grad_applies(24));  // a weight gradient over 24 tokens stays in train.dtype
  for (const Fp8Policy* p : {&t, &r}) {
    EXPECT_EQ(p->forward.a.format, Fp8Format::kE4M3);
    EXPECT_EQ(p->forward.b.format, Fp8Format::kE4M3);
    EXPECT_EQ(p->input_grad.a.format, Fp8Format::kE5M2);
    EXPECT_EQ(p->input_grad.b.format, Fp8Format::kE4M3);
    EXPECT_EQ(p->weight_grad.a.format, Fp8Format::kE5M2);
    EXPECT_EQ(p->weight_grad.b.format, Fp8Format::kE4M3);
  }
  EXPECT_EQ(t.forward.a.scaling, Fp8Scaling::kTensor);
  EXPECT_FALSE(t.power_of_2);
  EXPECT_EQ(r.forward.a.scaling, Fp8Scaling::kRow);
  EXPECT_EQ(r.input_grad.b.scaling, Fp8Scaling::kColumn);
  EXPECT_EQ(r.weight_grad.a.scaling, Fp8Scaling::kColumn);
  EXPECT_TRUE(r.power_of_2);
}

// One step's gradients of every unit, FP8 against fp32 on the same weights and batch: above 20 dB (torchao's floor
// for an FP8 linear's gradients), yet not equal (the casts are on); the loss within 1%.
TEST(Fp8Engine, AStepsGradientsTrackFp32) {
  omp_set_num_threads(1);
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama})
    for (Fp8Recipe recipe : {Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise}) {
      SCOPED_TRACE(std::string(to_string(arch)) + " " + to_string(recipe));
      SoloCommunicator solo;
      const testing::Trace ref = testing::train(tiny(arch, Fp8Recipe::kOff, 16), solo, kSeed, 1, /*record_grads=*/true);
      const testing::Trace got = testing::train(tiny(arch, recipe, 16), solo, kSeed, 1, /*record_grads=*/true);
      EXPECT_NEAR(got.losses[0], ref.losses[0], 1e-2 * ref.losses[0]);
      EXPECT_NE(got.losses[0], ref.losses[0]);
      for (size_t u = 0; u < ref.grads0.size(); ++u)
        EXPECT_GT(testing::snr_db(ref.grads0[u], got.grads0[u]), 20.0) << "unit " << u;
    }
}

// Four steps' losses within 1% of fp32's, and falling.
TEST(Fp8Engine, TrainsAsFp32DoesOverAFewSteps) {
  omp_set_num_threads(1);
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    SCOPED_TRACE(to_string(arch));
    SoloCommunicator solo;
    const testing::Trace ref = testing::train(tiny(arch, Fp8Recipe::kOff), solo, kSeed, 4);
    const testing::Trace got = testing::train(tiny(arch, Fp8Recipe::kRowwise), solo, kSeed, 4);
    for (size_t i = 0; i < ref.losses.size(); ++i) EXPECT_NEAR(got.losses[i], ref.losses[i], 1e-2 * ref.losses[i]);
    EXPECT_LT(got.losses.back(), got.losses.front());
  }
}

// Recompute re-runs a block's forward with the same casts (under delayed, recording the same maxima again): the same
// losses and parameters, bit for bit. With LoRA
// (and a QLoRA base) the frozen base's GEMMs take FP8 (no weight gradient) and the adapters' stay fp32: the adapters'
// gradients track fp32's above 20 dB.
TEST(Fp8Engine, RecomputeGivesTheSameBitsAndLoraTrainsItsAdapters) {
  omp_set_num_threads(1);
  SoloCommunicator solo;
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    SCOPED_TRACE(to_string(arch));
    for (Fp8Recipe recipe : {Fp8Recipe::kRowwise, Fp8Recipe::kDelayed}) {
      Config c = tiny(arch, recipe), r = c;
      r.train.recompute = true;
      const testing::Trace plain = testing::train(c, solo, kSeed, 3), again = testing::train(r, solo, kSeed, 3);
      EXPECT_EQ(again.losses, plain.losses) << to_string(recipe);
      EXPECT_EQ(again.params, plain.params) << to_string(recipe);
    }
    for (LoraBase base : {LoraBase::kBf16, LoraBase::kNf4}) {
      Config lora = tiny(arch, Fp8Recipe::kTensorwise);
      lora.model.lora.rank = 4;
      lora.model.lora.base_dtype = base;
      Config ref = lora;
      ref.train.fp8 = Fp8Recipe::kOff;
      const testing::Trace want = testing::train(ref, solo, kSeed, 1, /*record_grads=*/true);
      const testing::Trace got = testing::train(lora, solo, kSeed, 1, /*record_grads=*/true);
      EXPECT_NE(got.losses[0], want.losses[0]);
      for (size_t u = 0; u < want.grads0.size(); ++u)
        if (!want.grads0[u].empty()) EXPECT_GT(testing::snr_db(want.grads0[u], got.grads0[u]), 20.0) << "unit " << u;
    }
  }
}

// train.fp8 is how a run computes, not what it holds: a checkpoint written with FP8 resumes without it and back, with
// the state bit-identical.
TEST(Fp8Engine, CheckpointsResumeAcrossFp8AndOff) {
  omp_set_num_threads(1);
  for (Fp8Recipe from : {Fp8Recipe::kRowwise, Fp8Recipe::kOff}) {
    testing::TempDir dir;
    Config a = tiny(ModelArch::kLlama, from);
    a.ckpt.dir = dir.str();
    SoloCommunicator solo;
    StepEngine e(a, solo);
    testing::Trace t;
    const std::string where = testing::train_and_save(e, a, solo, kSeed, 2, &t);
    Config b = a;
    b.train.fp8 = from == Fp8Recipe::kOff ? Fp8Recipe::kTensorwise : Fp8Recipe::kOff;
    StepEngine f(b, solo);
    EXPECT_EQ(load_checkpoint(where, b, f.sharded(), solo).step, 2);
    EXPECT_EQ(testing::full_state(f.sharded()), testing::full_state(e.sharded())) << to_string(from);
  }
}

TEST(Fp8Engine, NRanksEqualOneProcess) {
  omp_set_num_threads(1);
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama})
    for (Fp8Recipe recipe : {Fp8Recipe::kTensorwise, Fp8Recipe::kRowwise}) {
      SCOPED_TRACE(std::string(to_string(arch)) + " " + to_string(recipe));
      testing::expect_ranks_equal_one_process(tiny(arch, recipe), kSeed, {2, 3}, /*param_bar=*/1e-4);
    }
}

}  // namespace
}  // namespace st
