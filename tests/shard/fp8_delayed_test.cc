// train.fp8=delayed on the CPU backend (model/fp8_history.h): the first step casts as tensorwise, later ones by the
// history's maxima and so differently, the training tracks fp32's, the history's length matters, evaluation records
// nothing and casts as tensorwise, N ranks push the same history as one process, and a checkpoint keeps the history so
// that a resumed run computes the uninterrupted run's bits. (Recompute:
// Fp8Engine.RecomputeGivesTheSameBitsAndLoraTrainsItsAdapters.)
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "../ckpt/ckpt_test_util.h"
#include "../common/config_problem.h"
#include "../common/fp8_tiny.h"
#include "../common/rank_equivalence.h"
#include "../common/temp_dir.h"
#include "../common/tiny_training.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/comm/fake_communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/fp8_policy.h"
#include "shardtrain/train/step_engine.h"

namespace st {
namespace {

constexpr uint64_t kSeed = 5;

// 16 tokens a micro-batch: every GEMM of the tiny model in FP8, weight gradients included.
Config tiny(ModelArch arch, Fp8Recipe fp8) { return testing::fp8_tiny(arch, fp8, Device::kCpu, DType::kF32, 16); }

// The history after `steps` steps of c, and the trace.
testing::Trace train_with_history(const Config& c, Communicator& comm, int64_t steps,
                                  std::vector<std::vector<float>>* history) {
  StepEngine e(c, comm);
  testing::Trace t;
  testing::train_steps(e, c, comm, kSeed, 0, steps, &t);
  t.params = e.gather_params();
  *history = e.sharded().fp8_history();
  return t;
}

TEST(Fp8Delayed, TheKeysAreCheckedBeforeAnythingRuns) {
  const auto problem = testing::config_problem;
  EXPECT_EQ(problem({"--train.fp8=delayed", "--train.fp8_amax_history=1"}), "");
  EXPECT_EQ(problem({"--train.fp8=delayed", "--train.fp8_amax_history=1024"}), "");
  EXPECT_EQ(problem({"--train.fp8=delayed", "--train.device=cuda", "--train.dtype=bf16"}), "");
  testing::expect_refused(
      {{{"--train.fp8=delayed", "--train.fp8_amax_history=0"}, "train.fp8_amax_history must be in [1, 1024] (got 0)"},
       {{"--train.fp8=delayed", "--train.fp8_amax_history=1025"}, "must be in [1, 1024] (got 1025)"},
       // A history length without the recipe that reads it is refused, not ignored.
       {{"--train.fp8=tensorwise", "--train.fp8_amax_history=4"},
        "train.fp8_amax_history (4) applies to train.fp8=delayed (got tensorwise)"}});
}

// Step 0 has no history: its casts scale by their own maxima, tensorwise's bits. From step 1 on they scale by the
// history's, which differ (the weights moved), and the losses part from tensorwise's while staying within 1% of
// fp32's (at 16 tokens a micro-batch the tiny model's loss does not yet fall in 4 steps, in fp32 either). One entry a
// step is pushed, each operand's maximum > 0.
TEST(Fp8Delayed, FirstStepCastsAsTensorwiseThenByTheHistory) {
  omp_set_num_threads(1);
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    SCOPED_TRACE(to_string(arch));
    SoloCommunicator solo;
    std::vector<std::vector<float>> history, none;
    const testing::Trace delayed = train_with_history(tiny(arch, Fp8Recipe::kDelayed), solo, 4, &history);
    const testing::Trace tensorwise = train_with_history(tiny(arch, Fp8Recipe::kTensorwise), solo, 4, &none);
    const testing::Trace fp32 = testing::train(tiny(arch, Fp8Recipe::kOff), solo, kSeed, 4);
    EXPECT_EQ(delayed.losses[0], tensorwise.losses[0]);
    EXPECT_EQ(testing::train(tiny(arch, Fp8Recipe::kDelayed), solo, kSeed, 1).params,
              testing::train(tiny(arch, Fp8Recipe::kTensorwise), solo, kSeed, 1).params);
    EXPECT_NE(delayed.losses, tensorwise.losses);
    for (size_t i = 0; i < fp32.losses.size(); ++i)
      EXPECT_NEAR(delayed.losses[i], fp32.losses[i], 1e-2 * fp32.losses[i]) << "step " << i;
    EXPECT_TRUE(none.empty());
    ASSERT_EQ(history.size(), 4u);
    const Config c = tiny(arch, Fp8Recipe::kDelayed);
    EXPECT_EQ(history[0].size(), static_cast<size_t>(c.model.n_layer) * block_linear_shapes(c.model).size() * 3);
    for (float m : history[0]) EXPECT_GT(m, 0.0f);
  }
}

// The history's length is part of the recipe: a one-step history scales by the last step's maxima alone.
TEST(Fp8Delayed, TheHistorysLengthMatters) {
  omp_set_num_threads(1);
  SoloCommunicator solo;
  Config one = tiny(ModelArch::kLlama, Fp8Recipe::kDelayed), sixteen = one;
  one.train.fp8_amax_history = 1;
  std::vector<std::vector<float>> h1, h16;
  const testing::Trace a = train_with_history(one, solo, 4, &h1), b = train_with_history(sixteen, solo, 4, &h16);
  EXPECT_EQ(h1.size(), 1u);
  EXPECT_EQ(h16.size(), 4u);
  EXPECT_EQ(a.losses[0], b.losses[0]);
  EXPECT_EQ(a.losses[1], b.losses[1]);  // both scale step 1 by step 0's maxima
  EXPECT_NE(a.params, b.params);
}

// Evaluation records nothing into the history: a run with evaluation passes between its steps pushes the same history
// and trains the same bits as one without.
TEST(Fp8Delayed, EvaluationRecordsNothing) {
  omp_set_num_threads(1);
  const Config c = tiny(ModelArch::kGpt2, Fp8Recipe::kDelayed);
  SoloCommunicator solo;
  StepEngine plain(c, solo), evaluated(c, solo);
  testing::Trace tp, te;
  for (int64_t step = 0; step < 3; ++step) {
    testing::train_steps(plain, c, solo, kSeed, step, step + 1, &tp);
    testing::train_steps(evaluated, c, solo, kSeed, step, step + 1, &te);
    // Batches of another seed, whose maxima would differ from the training batches'.
    const float loss = evaluated.evaluate(testing::corpus_batches(c, kSeed + 100, step), 2);
    EXPECT_TRUE(std::isfinite(loss));
  }
  EXPECT_EQ(te.losses, tp.losses);
  EXPECT_EQ(evaluated.sharded().fp8_history(), plain.sharded().fp8_history());
  EXPECT_EQ(evaluated.gather_params(), plain.gather_params());
}

// Evaluation casts as tensorwise, each tensor by its own maximum (the history holds the training batches' maxima, which
// say nothing of held-out text): the loss of tensorwise on the same weights, bit for bit.
TEST(Fp8Delayed, EvaluationCastsAsTensorwise) {
  omp_set_num_threads(1);
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    SCOPED_TRACE(to_string(arch));
    testing::TempDir dir;
    Config c = tiny(arch, Fp8Recipe::kDelayed);
    c.ckpt.dir = dir.str();
    const testing::DelayedEvaluation e = testing::evaluate_delayed_and_tensorwise(c, kSeed, 3);
    EXPECT_TRUE(std::isfinite(e.delayed));
    EXPECT_EQ(e.delayed, e.tensorwise);
  }
}

// N ranks push the maxima of the whole batch, the largest over every rank's micro-batches: the same bits on every
// rank, and the history one process pushes to 1e-5 (maxima of tensors whose sums were reordered); the parameters
// to the FP8 engine tests' 1e-4. Over 6 steps at lr 3e-3, in which the loss falls.
TEST(Fp8Delayed, NRanksEqualOneProcessAndPushOneHistory) {
  omp_set_num_threads(1);
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama}) {
    SCOPED_TRACE(to_string(arch));
    Config c = tiny(arch, Fp8Recipe::kDelayed);
    c.train.global_batch = 6;  // 6 micro-batches of one sequence: 6, 3 and 2 a rank at worlds 1, 2 and 3
    c.train.micro_batch = 1;
    c.optim.lr = 3e-3f;
    c.train.steps = 6;
    testing::expect_ranks_equal_one_process(c, kSeed, {2, 3}, /*param_bar=*/1e-4);
    SoloCommunicator solo;
    std::vector<std::vector<float>> want;
    train_with_history(c, solo, c.train.steps, &want);
    for (int world : {2, 3}) {
      std::vector<std::vector<std::vector<float>>> got(static_cast<size_t>(world));
      fake::spawn(world, [&](Communicator& comm) {
        train_with_history(c, comm, c.train.steps, &got[static_cast<size_t>(comm.rank())]);
      });
      for (int r = 1; r < world; ++r) EXPECT_EQ(got[static_cast<size_t>(r)], got[0]) << "world " << world;
      ASSERT_EQ(got[0].size(), want.size());
      for (size_t e = 0; e < want.size(); ++e)
        for (size_t i = 0; i < want[e].size(); ++i)
          EXPECT_NEAR(got[0][e][i], want[e][i], 1e-5 * want[e][i]) << "world " << world << " entry " << e;
    }
  }
}

// The checkpoint keeps the history: 2 steps, save, load into a fresh engine, 2 more give the uninterrupted run's
// losses, parameters and history, bit for bit. A delayed checkpoint resumes under tensorwise too, which takes no
// history.
TEST(Fp8Delayed, CheckpointsKeepTheHistory) {
  omp_set_num_threads(1);
  const Config base = tiny(ModelArch::kLlama, Fp8Recipe::kDelayed);
  SoloCommunicator solo;
  std::vector<std::vector<float>> want_history;
  const testing::Trace want = train_with_history(base, solo, 4, &want_history);

  testing::TempDir dir;
  Config a = base;
  a.ckpt.dir = dir.str();
  StepEngine e(a, solo);
  testing::Trace t;
  const std::string where = testing::train_and_save(e, a, solo, kSeed, 2, &t);
  EXPECT_EQ(read_manifest(where + "/manifest.json").fp8_amax_history, e.sharded().fp8_history());

  StepEngine f(a, solo);
  const CheckpointState resumed = load_checkpoint(where, a, f.sharded(), solo);
  EXPECT_EQ(resumed.step, 2);
  f.set_updates(resumed.optimizer_updates);
  EXPECT_EQ(f.sharded().fp8_history(), e.sharded().fp8_history());
  testing::train_steps(f, a, solo, kSeed, 2, 4, &t);
  EXPECT_EQ(t.losses, want.losses);
  EXPECT_EQ(f.gather_params(), want.params);
  EXPECT_EQ(f.sharded().fp8_history(), want_history);

  Config tw = a;
  tw.train.fp8 = Fp8Recipe::kTensorwise;
  StepEngine g(tw, solo);
  EXPECT_EQ(load_checkpoint(where, tw, g.sharded(), solo).step, 2);
  EXPECT_EQ(testing::full_state(g.sharded()), testing::full_state(e.sharded()));
  EXPECT_TRUE(g.sharded().fp8_history().empty());
}

// A history of another model's sites is refused with the checkpoint named.
TEST(Fp8Delayed, AHistoryOfOtherSitesIsRefused) {
  const Config c = tiny(ModelArch::kGpt2, Fp8Recipe::kDelayed);
  SoloCommunicator solo;
  StepEngine e(c, solo);
  const std::string msg = testing::bad_input_message(
      [&] { e.sharded().load_fp8_history({std::vector<float>(6, 1.0f)}, "/ckpt/step_00000002/manifest.json"); });
  EXPECT_NE(msg.find("/ckpt/step_00000002/manifest.json: fp8_amax_history entry 0 holds 6 maxima"), std::string::npos)
      << msg;
  // Without delayed scaling a checkpoint's history has nothing to go to.
  Config t = c;
  t.train.fp8 = Fp8Recipe::kTensorwise;
  StepEngine f(t, solo);
  f.sharded().load_fp8_history({std::vector<float>(6, 1.0f)}, "unused");
  EXPECT_TRUE(f.sharded().fp8_history().empty());
}

}  // namespace
}  // namespace st
