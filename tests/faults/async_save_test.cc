// Background saves (ckpt.async) under a stop signal: a signal that arrives while a save is still pending lets that
// save commit, then commits the preemption save of the current step, then exits 76; and a run stopped that way
// resumes to the same weights as a run that was never stopped.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"
#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/file_io.h"

namespace fs = std::filesystem;

namespace st {
namespace {

using st::testing::CliResult;
using st::testing::run_command;
using st::testing::TempDir;

std::string train_args(const std::string& dir, int steps, const std::string& extra = "") {
  return std::string(" train --config ") + SHARDTRAIN_SOURCE_DIR +
         "/configs/tiny.ini --model.n_layer=1 --model.n_head=2 --model.n_embd=32 --model.seq_len=32"
         " --train.micro_batch=2 --train.global_batch=4 --train.eval_every=0 --train.eval_batches=1"
         " --train.sample_tokens=0 --ckpt.keep=0 --ckpt.every=2 --train.steps=" +
         std::to_string(steps) + " --ckpt.dir=" + dir + " " + extra;
}

std::string mpirun(int ranks) {
  return "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 timeout 300 mpirun "
         "--oversubscribe --bind-to none --mca btl self,vader -np " +
         std::to_string(ranks) + " ";
}

bool committed(const std::string& dir, const std::string& step) {
  return fs::exists(fs::path(dir) / step / "manifest.json");
}

// The step 2 save is still pending at the end of step 3 (its commit is reported one step boundary after the writes
// end, at the earliest), when rank `signalled` raises SIGTERM: step 2 commits, then step 3, then exit 76.
void expect_pending_save_then_preemption_save(int ranks, int signalled) {
  if (ranks > 1 && run_command("command -v mpirun").code != 0) GTEST_SKIP() << "mpirun is not installed";
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  const std::string fault = "SHARDTRAIN_FAULT=sigterm:" + std::to_string(signalled) + "@3 ";
  const CliResult r = run_command(fault + (ranks > 1 ? mpirun(ranks) : std::string()) + SHARDTRAIN_BINARY +
                                  train_args(dir, 20, "--ckpt.async=true"));
  EXPECT_EQ(r.code, 76) << r.output;
  EXPECT_TRUE(committed(dir, "step_00000002")) << r.output;
  EXPECT_TRUE(committed(dir, "step_00000003")) << r.output;
  EXPECT_FALSE(fs::exists(fs::path(dir) / "step_00000004")) << r.output;
  EXPECT_EQ(read_file(dir + "/latest"), "step_00000003\n");
  const size_t first = r.output.find("checkpoint: saved step 2 ");
  const size_t second = r.output.find("checkpoint: saved step 3 ");
  ASSERT_NE(first, std::string::npos) << r.output;
  ASSERT_NE(second, std::string::npos) << r.output;
  EXPECT_LT(first, second) << r.output;
  EXPECT_NE(r.output.find("preempted (a stop signal on 1 rank(s)) after step 3: checkpoint " + dir +
                          "/step_00000003 committed"),
            std::string::npos)
      << r.output;
  for (const char* step : {"step_00000002", "step_00000003"}) {
    const CliResult v = run_command(std::string(SHARDTRAIN_BINARY) + " ckpt verify " + dir + "/" + step);
    EXPECT_EQ(v.code, 0) << v.output;
  }
}

TEST(AsyncSaveTest, StopSignalWithASavePendingCommitsBothSaves) { expect_pending_save_then_preemption_save(1, 0); }

TEST(AsyncSaveTest, StopSignalOnOneOfTwoRanksWithASavePendingCommitsBothSaves) {
  expect_pending_save_then_preemption_save(2, 1);
}

// Preempted at step 3 and resumed, the run ends with the same checkpoint bytes of state as one never stopped, saving
// in the background or not.
TEST(AsyncSaveTest, PreemptedAndResumedEqualsStraightThrough) {
  if (run_command("command -v mpirun").code != 0) GTEST_SKIP() << "mpirun is not installed";
  TempDir tmp;
  for (const char* mode : {"true", "false"}) {
    const std::string straight = tmp.file(std::string("straight-") + mode);
    const std::string stopped = tmp.file(std::string("stopped-") + mode);
    const std::string async = std::string("--ckpt.async=") + mode;
    CliResult r = run_command(mpirun(2) + SHARDTRAIN_BINARY + train_args(straight, 6, async));
    ASSERT_EQ(r.code, 0) << r.output;
    r = run_command("SHARDTRAIN_FAULT=sigterm:0@3 " + mpirun(2) + SHARDTRAIN_BINARY + train_args(stopped, 6, async));
    ASSERT_EQ(r.code, 76) << r.output;
    r = run_command(mpirun(2) + SHARDTRAIN_BINARY + train_args(stopped, 6, async));
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("resumed from " + stopped + "/step_00000003"), std::string::npos) << r.output;
    // The shard files hold object timestamps, so the state is compared through the checkpoint's own export.
    for (const std::string& d : {straight, stopped}) {
      const CliResult e = run_command(std::string(SHARDTRAIN_BINARY) + " ckpt export " + d + "/step_00000006 --out " +
                                      d + "/final.safetensors");
      ASSERT_EQ(e.code, 0) << e.output;
    }
    EXPECT_EQ(sha256_file(straight + "/final.safetensors"), sha256_file(stopped + "/final.safetensors")) << mode;
  }
}

}  // namespace
}  // namespace st
