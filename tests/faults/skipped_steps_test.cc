// A run that applies no update trained nothing: every step skipped for a non-finite gradient (here forced with
// SHARDTRAIN_FAULT=grad_inf, as weights that overflow would) is bad input, exit 2 (README "Exit codes"), not a
// success with "final loss nan", and not a fault to retry. A skipped step among applied ones is still a success.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"

namespace st {
namespace {

using st::testing::CliResult;
using st::testing::run_shardtrain;
using st::testing::TempDir;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// configs/tiny.ini cut down until a step takes milliseconds (as tests/faults/resume_test.cc).
std::string tiny_args(const std::string& extra) {
  return std::string(" --config ") + SHARDTRAIN_SOURCE_DIR +
         "/configs/tiny.ini --model.n_layer=1 --model.n_head=2 --model.n_embd=32 --model.seq_len=32"
         " --train.micro_batch=4 --train.global_batch=4 --train.eval_every=0 --train.eval_batches=1"
         " --train.sample_tokens=0 --ckpt.keep=0" +
         extra;
}

CliResult train(const std::string& extra, const std::string& fault = "") {
  return run_shardtrain("train" + tiny_args(extra),
                        "OMP_NUM_THREADS=1" + (fault.empty() ? std::string() : " SHARDTRAIN_FAULT=" + fault));
}

TEST(SkippedSteps, ARunWhoseEveryStepWasSkippedExitsTwo) {
  TempDir tmp;
  const std::string ckpt = " --ckpt.dir=" + tmp.file("ck");
  CliResult r = train(" --train.steps=3" + ckpt, "grad_inf:0");  // every step of rank 0
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "every one of the 3 step(s) this run took was skipped, so no update was applied and "
                                 "the weights are those it started from: 3 for a non-finite loss or gradient norm"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "done:")) << r.output;
  // Its checkpoint holds the starting weights: a rerun does not turn it into a success.
  r = train(" --train.steps=3" + ckpt);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "nothing to train: the checkpoint " + tmp.file("ck") +
                                     "/step_00000003 is at step 3, but all 3 of its steps were skipped"))
      << r.output;
}

// Trained, resumed, and then every step of the resumed part skipped: that part trained nothing.
TEST(SkippedSteps, AResumedRunWhoseEveryNewStepWasSkippedExitsTwo) {
  TempDir tmp;
  const std::string ckpt = " --ckpt.dir=" + tmp.file("ck");
  CliResult r = train(" --train.steps=2" + ckpt);
  ASSERT_EQ(r.code, 0) << r.output;
  r = train(" --train.steps=4" + ckpt, "grad_inf:0");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "every one of the 2 step(s) this run took was skipped")) << r.output;
}

TEST(SkippedSteps, ASkippedStepAmongAppliedOnesIsStillASuccess) {
  const CliResult r = train(" --train.steps=2", "grad_inf:0@1");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "done: 2 steps (1 skipped)")) << r.output;
}

}  // namespace
}  // namespace st
