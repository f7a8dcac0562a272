// train.fp8=delayed on the CUDA backend (model/cuda_fp8_history.h: the history on the device, picked by each cast and
// pushed at the step's end without the host) against the CPU backend's (model/fp8_history.h), both families: in fp32
// the first step's loss and maxima within 1e-3 of the CPU's (the GEMMs differ in accumulation only), four steps'
// losses within 1e-2 and their maxima within 2x; the first step casts as tensorwise does, bit for bit, and later ones
// do not. In bf16: recompute repeats the bits, evaluation between steps records nothing and casts as tensorwise,
// optimizer offload (whose step ends on the host path) trains the device optimizer's bits, and a checkpoint resumes the
// uninterrupted run's bits and history.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../common/fp8_gpu_test.h"
#include "../common/fp8_tiny.h"
#include "../common/temp_dir.h"
#include "../common/tiny_training.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/train/step_engine.h"

namespace st {
namespace {

constexpr uint64_t kSeed = 5;

Config tiny(ModelArch arch, Fp8Recipe recipe, Device device, DType dtype) {
  return testing::fp8_tiny(arch, recipe, device, dtype, 16);
}

// `steps` steps of c on one device: the trace with the parameters, and the history after them.
testing::Trace train(const Config& c, int64_t steps, std::vector<std::vector<float>>* history = nullptr) {
  SoloCommunicator solo;
  StepEngine e(c, solo);
  testing::Trace t;
  testing::train_steps(e, c, solo, kSeed, 0, steps, &t);
  t.params = e.gather_params();
  if (history) *history = e.sharded().fp8_history();
  return t;
}

TEST(Fp8DelayedCuda, StepsMatchTheCpusEmulation) {
  ST_SKIP_WITHOUT_FP8();
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    SCOPED_TRACE(to_string(arch));
    std::vector<std::vector<float>> cpu_history, gpu_history;
    const testing::Trace cpu = train(tiny(arch, Fp8Recipe::kDelayed, Device::kCpu, DType::kF32), 4, &cpu_history);
    const testing::Trace gpu = train(tiny(arch, Fp8Recipe::kDelayed, Device::kCuda, DType::kF32), 4, &gpu_history);
    // Step 0 on the same weights: 1e-3; later steps' weights have parted by the updates of elements whose gradients
    // differ in the GEMMs' accumulation: 1e-2.
    for (size_t i = 0; i < cpu.losses.size(); ++i)
      EXPECT_NEAR(gpu.losses[i], cpu.losses[i], (i == 0 ? 1e-3 : 1e-2) * cpu.losses[i]) << "step " << i;
    // The history: step 0's maxima (the last entry, newest first) within 1e-3. Later steps' are maxima of weights and
    // activations a few AdamW steps apart, where an element whose update changed sign between the backends moves a
    // maximum by lr: measured up to 11% apart (41% for one gradient's), so those are held to the same operand's
    // order of magnitude (within 2x), which a maximum pushed into another operand's or another step's slot is not.
    ASSERT_EQ(gpu_history.size(), cpu_history.size());
    for (size_t e = 0; e < cpu_history.size(); ++e) {
      ASSERT_EQ(gpu_history[e].size(), cpu_history[e].size());
      for (size_t i = 0; i < cpu_history[e].size(); ++i) {
        const double cpu_max = cpu_history[e][i], gpu_max = gpu_history[e][i];
        if (e + 1 == cpu_history.size()) {
          EXPECT_NEAR(gpu_max, cpu_max, 1e-3 * cpu_max) << "entry " << e << " " << i;
        } else {
          EXPECT_GT(gpu_max, 0.5 * cpu_max) << "entry " << e << " " << i;
          EXPECT_LT(gpu_max, 2.0 * cpu_max) << "entry " << e << " " << i;
        }
      }
    }
    // Step 0 has no history: tensorwise's bits; then the history's scales.
    const testing::Trace tensorwise = train(tiny(arch, Fp8Recipe::kTensorwise, Device::kCuda, DType::kF32), 4);
    EXPECT_EQ(gpu.losses[0], tensorwise.losses[0]);
    EXPECT_EQ(train(tiny(arch, Fp8Recipe::kDelayed, Device::kCuda, DType::kF32), 1).params,
              train(tiny(arch, Fp8Recipe::kTensorwise, Device::kCuda, DType::kF32), 1).params);
    EXPECT_NE(gpu.losses, tensorwise.losses);
  }
}

TEST(Fp8DelayedCuda, RecomputeOffloadAndEvaluationKeepTheBits) {
  ST_SKIP_WITHOUT_FP8();
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    SCOPED_TRACE(to_string(arch));
    const Config c = tiny(arch, Fp8Recipe::kDelayed, Device::kCuda, DType::kBF16);
    std::vector<std::vector<float>> want_history, history;
    const testing::Trace want = train(c, 3, &want_history);
    ASSERT_EQ(want_history.size(), 3u);

    Config r = c;
    r.train.recompute = true;
    const testing::Trace again = train(r, 3, &history);
    EXPECT_EQ(again.losses, want.losses) << "recompute";
    EXPECT_EQ(again.params, want.params) << "recompute";
    EXPECT_EQ(history, want_history) << "recompute";

    Config o = c;
    o.optim.offload = OffloadMode::kOptimizer;
    o.optim.offload_threads = 2;
    const testing::Trace offloaded = train(o, 3, &history);
    EXPECT_EQ(offloaded.losses, want.losses) << "offload";
    EXPECT_EQ(offloaded.params, want.params) << "offload";
    EXPECT_EQ(history, want_history) << "offload";

    SoloCommunicator solo;
    StepEngine e(c, solo);
    testing::Trace t;
    for (int64_t step = 0; step < 3; ++step) {
      testing::train_steps(e, c, solo, kSeed, step, step + 1, &t);
      EXPECT_TRUE(std::isfinite(e.evaluate(testing::corpus_batches(c, kSeed + 100, step), 2)));
    }
    EXPECT_EQ(t.losses, want.losses) << "evaluation between steps";
    EXPECT_EQ(e.gather_params(), want.params) << "evaluation between steps";
    EXPECT_EQ(e.sharded().fp8_history(), want_history) << "evaluation between steps";
  }
}

// Evaluation casts as tensorwise (each tensor by its own maximum, no fused casts ahead): tensorwise's loss on the same
// weights, bit for bit, in bf16.
TEST(Fp8DelayedCuda, EvaluationCastsAsTensorwise) {
  ST_SKIP_WITHOUT_FP8();
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    SCOPED_TRACE(to_string(arch));
    testing::TempDir dir;
    Config c = tiny(arch, Fp8Recipe::kDelayed, Device::kCuda, DType::kBF16);
    c.ckpt.dir = dir.str();
    const testing::DelayedEvaluation e = testing::evaluate_delayed_and_tensorwise(c, kSeed, 3);
    EXPECT_TRUE(std::isfinite(e.delayed));
    EXPECT_EQ(e.delayed, e.tensorwise);
  }
}

TEST(Fp8DelayedCuda, CheckpointsKeepTheHistory) {
  ST_SKIP_WITHOUT_FP8();
  testing::TempDir dir;
  Config c = tiny(ModelArch::kLlama, Fp8Recipe::kDelayed, Device::kCuda, DType::kBF16);
  c.ckpt.dir = dir.str();
  std::vector<std::vector<float>> want_history;
  const testing::Trace want = train(c, 4, &want_history);

  SoloCommunicator solo;
  StepEngine e(c, solo);
  testing::Trace t;
  const std::string where = testing::train_and_save(e, c, solo, kSeed, 2, &t);
  StepEngine f(c, solo);
  const CheckpointState resumed = load_checkpoint(where, c, f.sharded(), solo);
  f.set_updates(resumed.optimizer_updates);
  EXPECT_EQ(f.sharded().fp8_history(), e.sharded().fp8_history());
  testing::train_steps(f, c, solo, kSeed, 2, 4, &t);
  EXPECT_EQ(t.losses, want.losses);
  EXPECT_EQ(f.gather_params(), want.params);
  EXPECT_EQ(f.sharded().fp8_history(), want_history);
}

}  // namespace
}  // namespace st
