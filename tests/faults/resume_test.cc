// Resuming from, evaluating and exporting a checkpoint a user has edited or damaged; a `latest` that is a
// directory; resuming with a changed data order; resuming a finished run. Every reader of a checkpoint (train's
// resume, eval, ckpt export, ckpt verify) must refuse an inconsistent one with exit code 2, naming the file and
// both values, and leave the checkpoint directory as it was.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <stdlib.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"
#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/dir_lock.h"
#include "shardtrain/ckpt/file_io.h"

namespace fs = std::filesystem;

namespace st {
namespace {

using st::testing::CliResult;
using st::testing::run_shardtrain;
using st::testing::TempDir;

// configs/tiny.ini cut down until a step takes milliseconds: 1 layer, n_embd 32, T 32, 4 sequences a step (unless
// `extra` sets train.global_batch).
std::string tiny_args(const std::string& extra = "") {
  return std::string(" --config ") + SHARDTRAIN_SOURCE_DIR +
         "/configs/tiny.ini --model.n_layer=1 --model.n_head=2 --model.n_embd=32 --model.seq_len=32"
         " --train.micro_batch=4 --train.eval_every=0 --train.eval_batches=1 --train.sample_tokens=0 --ckpt.keep=0" +
         (extra.find("--train.global_batch") == std::string::npos ? " --train.global_batch=4" : "") + extra;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Every file below `dir` with its bytes.
// Every path under `dir` with its SHA-256 ("<dir>" for a directory), except the lock file, whose holder record
// each job rewrites by design (dir_lock.h).
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().filename() == st::kDirLockFile) continue;
    out[e.path().string()] = e.is_regular_file() ? st::sha256_file(e.path().string()) : std::string("<dir>");
  }
  return out;
}

nlohmann::ordered_json read_json(const std::string& path) {
  return nlohmann::ordered_json::parse(testing::read_bytes(path));
}
void write_json(const std::string& path, const nlohmann::ordered_json& j) {
  testing::write_bytes(path, j.dump(2) + "\n");
}

// Sets the int64 attribute `name` of the file's root group.
void set_root_attr(const std::string& path, const char* name, int64_t value) {
  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0) << path;
  const hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  ASSERT_GE(a, 0) << path << " " << name;
  EXPECT_GE(H5Awrite(a, H5T_NATIVE_INT64, &value), 0);
  H5Aclose(a);
  H5Fclose(f);
}

class ResumeFaultTest : public ::testing::Test {
 protected:
  // One 4-step run (checkpoints at steps 2 and 4), copied into each test's own directory.
  static void SetUpTestSuite() {
    setenv("OMP_NUM_THREADS", "1", 1);
    pristine_ = new TempDir;
    const CliResult r =
        run_shardtrain("train" + tiny_args() + " --train.steps=4 --ckpt.every=2 --ckpt.dir=" + pristine_->file("ckpt"));
    ASSERT_EQ(r.code, 0) << r.output;
  }
  static void TearDownTestSuite() {
    delete pristine_;
    pristine_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(fs::exists(pristine_->file("ckpt/step_00000004/manifest.json")));
    fs::copy(pristine_->file("ckpt"), ckpt(), fs::copy_options::recursive);
  }

  std::string ckpt() const { return tmp_.file("ckpt"); }
  std::string step_dir(const std::string& name = "step_00000004") const { return ckpt() + "/" + name; }
  std::string manifest(const std::string& name = "step_00000004") const { return step_dir(name) + "/manifest.json"; }
  std::string rank0(const std::string& name = "step_00000004") const { return step_dir(name) + "/rank_00000.h5"; }

  CliResult resume(const std::string& extra = "") const {
    return run_shardtrain("train" + tiny_args(extra) + " --train.steps=6 --ckpt.dir=" + ckpt());
  }

  // Resume, eval, ckpt export and ckpt verify of `dir` all exit 2 with every needle in their output, and
  // nothing in ckpt.dir changes.
  void expect_every_reader_refuses(const std::string& dir, const std::vector<std::string>& needles) {
    const std::map<std::string, std::string> before = snapshot(ckpt());
    const std::string out = tmp_.file("hf/model.safetensors");
    fs::create_directories(tmp_.file("hf"));
    const std::map<std::string, CliResult> runs = {
        {"train (resume)", resume()},
        {"eval", run_shardtrain("eval --ckpt " + dir)},
        {"ckpt export", run_shardtrain("ckpt export " + dir + " --out " + out)},
        {"ckpt verify", run_shardtrain("ckpt verify " + dir)},
    };
    for (const auto& [what, r] : runs) {
      EXPECT_EQ(r.code, 2) << what << ":\n" << r.output;
      for (const std::string& n : needles)
        EXPECT_TRUE(contains(r.output, n)) << what << ": no '" << n << "' in\n" << r.output;
      EXPECT_FALSE(contains(r.output, "final loss")) << what << ":\n" << r.output;
    }
    EXPECT_EQ(snapshot(ckpt()), before) << "ckpt.dir changed";
    EXPECT_FALSE(fs::exists(out));
  }

  static TempDir* pristine_;
  TempDir tmp_;
};

TempDir* ResumeFaultTest::pristine_ = nullptr;

// 4 -> 5 would resume "at step 5" on step 4's state; 4 -> 2 would train steps 3-6 on step 4's weights and then
// replace the committed step_00000004.
TEST_F(ResumeFaultTest, ManifestStepEditedUpOrDownIsRefusedAndTheCheckpointKept) {
  const std::string pristine = testing::read_bytes(manifest());
  for (int edited : {5, 2}) {
    auto j = read_json(manifest());
    j["step"] = edited;
    write_json(manifest(), j);
    expect_every_reader_refuses(step_dir(), {manifest() +
                                             ": step mismatch: expected 4 (the directory name "
                                             "step_00000004), actual " +
                                             std::to_string(edited) + " (manifest step)"});
    testing::write_bytes(manifest(), pristine);
  }
}

// Directory renamed with the manifest, whose step-derived fields follow: only the rank file's own step attribute
// still says 4.
TEST_F(ResumeFaultTest, StepDirectoryRenamedWithItsManifestIsRefusedByTheRankFile) {
  auto j = read_json(manifest());
  j["step"] = 5;
  j["lr_step"] = 5;
  j["data_cursor"] = 20;
  write_json(manifest(), j);
  fs::rename(step_dir(), step_dir("step_00000005"));  // resume=auto now picks it as the newest
  expect_every_reader_refuses(
      step_dir("step_00000005"),
      {rank0("step_00000005") + ": step attribute mismatch: expected 5 (manifest step), actual 4"});
}

// world_size 1 -> 2 with a second file entry that holds no element: valid on its face, but rank_00000.h5 was
// written by a world of 1.
TEST_F(ResumeFaultTest, ManifestWorldSizeEditedIsRefused) {
  auto j = read_json(manifest());
  j["world_size"] = 2;
  j["rng_counters"] = {0, 0};
  auto extra = j["files"][0];
  extra["name"] = "rank_00001.h5";
  extra["rank"] = 1;
  for (auto& s : extra["spans"]) s = {{"offset", 0}, {"count", 0}};
  j["files"].push_back(extra);
  write_json(manifest(), j);
  fs::copy_file(rank0(), step_dir() + "/rank_00001.h5");
  expect_every_reader_refuses(
      step_dir(), {rank0() + ": world_size attribute mismatch: expected 2 (manifest world_size), actual 1"});
}

TEST_F(ResumeFaultTest, RankFileSizeChangedIsRefused) {
  const std::string bytes = testing::read_bytes(rank0());
  testing::write_bytes(rank0(), bytes + "garbage");
  expect_every_reader_refuses(step_dir(), {rank0() + ": size mismatch: expected " + std::to_string(bytes.size()) +
                                           " bytes (manifest), actual " + std::to_string(bytes.size() + 7)});
}

// The rank file's step attribute rewritten, and the manifest's size and hash updated to match the new bytes.
TEST_F(ResumeFaultTest, RankFileStepAttributeEditedIsRefused) {
  set_root_attr(rank0(), "step", 3);
  auto j = read_json(manifest());
  j["files"][0]["bytes"] = file_size(rank0());
  j["files"][0]["piece_sha256"] = file_digest(rank0(), j["digest_piece_bytes"].get<int64_t>());
  write_json(manifest(), j);
  expect_every_reader_refuses(step_dir(),
                              {rank0() + ": step attribute mismatch: expected 4 (manifest step), actual 3"});
}

// A `latest` made a directory: every save would commit its step, then fail to replace `latest` (exit 75), and a
// retry loop would never end. Refused before step 1, resuming or not.
TEST_F(ResumeFaultTest, LatestThatIsADirectoryIsRefusedBeforeTraining) {
  fs::remove(ckpt() + "/latest");
  fs::create_directories(ckpt() + "/latest/x");
  const std::map<std::string, std::string> before = snapshot(ckpt());
  for (const std::string& extra : {std::string(), std::string(" --ckpt.resume=none")}) {
    const CliResult r = resume(extra);
    EXPECT_EQ(r.code, 2) << extra << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, ckpt() + "/latest is a directory: it must be a file holding the name of the "
                                            "newest committed step directory"))
        << r.output;
    EXPECT_EQ(snapshot(ckpt()), before) << extra;
  }
}

TEST_F(ResumeFaultTest, ChangedDataOrderIsRefusedNamingEachKey) {
  const std::map<std::string, std::string> before = snapshot(ckpt());
  struct Case {
    std::string args;
    std::vector<std::string> named;
  };
  const std::vector<Case> cases = {
      {" --train.global_batch=8", {"train.global_batch is 4 in the checkpoint, 8 in this run"}},
      {" --data.shuffle=false", {"data.shuffle is true in the checkpoint, false in this run"}},
      {" --train.seed=7", {"train.seed is 1337 in the checkpoint, 7 in this run"}},
      {" --train.global_batch=8 --data.shuffle=false --train.seed=7",
       {"train.global_batch is 4 in the checkpoint, 8 in this run",
        "data.shuffle is true in the checkpoint, false in this run",
        "train.seed is 1337 in the checkpoint, 7 in this run"}},
      {" --data.val_holdout=0.5",
       {"windows in the checkpoint", "(data.path, data.val_path or data.val_holdout changed)"}},
  };
  for (const Case& c : cases) {
    const CliResult r = resume(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, step_dir() + ": resuming would change the data order: ")) << r.output;
    EXPECT_TRUE(contains(r.output, "ckpt.allow_data_change = true")) << r.output;
    for (const std::string& n : c.named)
      EXPECT_TRUE(contains(r.output, n)) << c.args << ": no '" << n << "' in\n" << r.output;
    EXPECT_EQ(snapshot(ckpt()), before) << c.args;
  }
}

TEST_F(ResumeFaultTest, AllowedDataChangeSaysWhatIsSkipped) {
  const CliResult r = resume(" --train.global_batch=8 --ckpt.allow_data_change=true");
  ASSERT_EQ(r.code, 0) << r.output;
  const int64_t windows = read_json(manifest())["train_windows"].get<int64_t>();
  EXPECT_TRUE(contains(r.output, "ckpt.allow_data_change: train.global_batch is 4 in the checkpoint, 8 in this run"))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "data: the checkpoint trained on global sequences [0, 16) (step 4 x 4), shuffled "
                       "with train.seed 1337; this run continues at step 5 from global sequence 32 = epoch "
                       "0, position 32 of " +
                           std::to_string(windows) + " windows"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "data: global sequences [16, 32) of the order are skipped")) << r.output;
  EXPECT_TRUE(fs::exists(manifest("step_00000006")));
}

TEST_F(ResumeFaultTest, ResumeSaysWhereTheDataContinues) {
  const CliResult r = resume();
  ASSERT_EQ(r.code, 0) << r.output;
  const int64_t windows = read_json(manifest())["train_windows"].get<int64_t>();
  EXPECT_TRUE(contains(r.output,
                       "data: the checkpoint trained on global sequences [0, 16) (step 4 x 4), shuffled "
                       "with train.seed 1337; this run continues at step 5 from global sequence 16 = epoch "
                       "0, position 16 of " +
                           std::to_string(windows) +
                           " windows, shuffled with "
                           "train.seed 1337"))
      << r.output;
  EXPECT_FALSE(contains(r.output, "are skipped")) << r.output;
  EXPECT_FALSE(contains(r.output, "are trained on again")) << r.output;
}

// A manifest without train_windows (written by a build that did not record it) still resumes, with a note.
TEST_F(ResumeFaultTest, ManifestWithoutTrainWindowsResumesWithANote) {
  auto j = read_json(manifest());
  ASSERT_TRUE(j.contains("train_windows"));
  j.erase("train_windows");
  write_json(manifest(), j);
  const CliResult r = resume(" --data.val_holdout=0.5");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, step_dir() + " does not record its training data's window count")) << r.output;
  EXPECT_TRUE(fs::exists(manifest("step_00000006")));
}

TEST_F(ResumeFaultTest, ResumingAFinishedRunHasNothingToTrain) {
  for (int steps : {4, 3}) {
    const std::map<std::string, std::string> before = snapshot(ckpt());
    const CliResult r =
        run_shardtrain("train" + tiny_args() + " --train.steps=" + std::to_string(steps) + " --ckpt.dir=" + ckpt());
    EXPECT_EQ(r.code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "done: nothing to train: the checkpoint is at step 4, train.steps is " +
                                       std::to_string(steps) + "\n"))
        << r.output;
    EXPECT_FALSE(contains(r.output, "final loss")) << r.output;
    EXPECT_FALSE(contains(r.output, "val_loss")) << r.output;
    EXPECT_EQ(snapshot(ckpt()), before) << "train.steps " << steps;
  }
}

// `ckpt verify` of a regular file, and of a path that is not there: each named for what it is.
TEST(CkptPaths, VerifyOfAFileSaysItIsAFileAndOfNothingThatItIsMissing) {
  TempDir tmp;
  testing::write_bytes(tmp.file("step_00000004"), "not a directory\n");
  CliResult r = run_shardtrain("ckpt verify " + tmp.file("step_00000004"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, tmp.file("step_00000004") + " is a file, not a checkpoint directory")) << r.output;
  EXPECT_FALSE(contains(r.output, "no such directory")) << r.output;
  r = run_shardtrain("ckpt verify " + tmp.file("gone"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, tmp.file("gone") + " is not a committed checkpoint: no such file or directory"))
      << r.output;
}

}  // namespace
}  // namespace st
