// The shardtrain binary as a user runs it: exit codes, error messages and the default run end to end.
#include <gtest/gtest.h>

#include "../common/run_shardtrain.h"
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

using Result = st::testing::CliResult;
using st::testing::run_shardtrain;

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("shardtrain_cli_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  fs::path dir_;
};

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

TEST_F(Cli, HelpListsEveryConfigKey) {
  const Result r = run_shardtrain("--help");
  EXPECT_EQ(r.code, 0);
  for (const char* key : {"model.n_layer", "model.n_head", "model.n_embd", "model.vocab_size", "model.seq_len",
                          "train.steps", "train.global_batch", "train.micro_batch", "train.seed", "train.eval_every",
                          "train.eval_batches", "optim.lr", "optim.min_lr", "optim.warmup_steps",
                          "optim.weight_decay", "optim.beta1", "optim.beta2", "optim.eps", "optim.grad_clip",
                          "data.path", "data.format", "data.val_path", "data.shuffle", "log.metrics", "log.every"})
    EXPECT_TRUE(contains(r.output, key)) << key;
  const Result t = run_shardtrain("train --help");
  EXPECT_EQ(t.code, 0);
  EXPECT_TRUE(contains(t.output, "train.micro_batch"));
}

TEST_F(Cli, UnknownCommandIsBadInput) {
  const Result r = run_shardtrain("trian");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.output, "trian")) << r.output;
}

TEST_F(Cli, MissingConfigFileNamesThePath) {
  const Result r = run_shardtrain("train --config " + (dir_ / "nope.ini").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.output, (dir_ / "nope.ini").string())) << r.output;
}

TEST_F(Cli, UnknownKeyNamesKeyAndFile) {
  const std::string ini = write("bad.ini", "[train]\nstepz = 3\n");
  const Result r = run_shardtrain("train --config " + ini);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.output, "train.stepz")) << r.output;
  EXPECT_TRUE(contains(r.output, ini)) << r.output;
}

TEST_F(Cli, NonDividingBatchShowsAllThreeNumbers) {
  const Result r = run_shardtrain("train --train.global_batch=24 --train.micro_batch=16");
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.output, "24") && contains(r.output, "16") && contains(r.output, "(1)")) << r.output;
}

TEST_F(Cli, BadDataIsReportedBeforeAnyStep) {
  // An llm.c shard with the wrong magic number.
  std::vector<int32_t> header(256, 0);
  header[0] = 12345;
  header[1] = 1;
  header[2] = 0;
  std::string bytes(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  const std::string shard = write("bad.bin", bytes);
  const std::string metrics = (dir_ / "m.jsonl").string();
  const Result r = run_shardtrain("train --data.format=llmc --data.path=" + shard + " --log.metrics=" + metrics);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.output, shard)) << r.output;
  EXPECT_TRUE(contains(r.output, "20240520")) << r.output;
  EXPECT_FALSE(fs::exists(metrics));  // nothing ran
}

// `eval` reads data.path whole with the documented batch layout, which is the layout of a validation
// pass; pointed at the file the run validated on, it must print the run's final val_loss.
TEST_F(Cli, EvalOfACheckpointEqualsTheRunsValidationLoss) {
  std::string text;
  for (int i = 0; i < 400; ++i) text += "line " + std::to_string(i * 7919 % 1000) + ": the quick brown fox.\n";
  const std::string val = write("val.txt", text);
  const std::string metrics = (dir_ / "m.jsonl").string();
  const std::string ckpt = (dir_ / "ckpt").string();
  const Result r = run_shardtrain("train --config " + std::string(SHARDTRAIN_SOURCE_DIR) +
                                  "/configs/tiny.ini --train.steps=3 --train.sample_tokens=0 --model.seq_len=32 "
                                  "--train.micro_batch=4 --train.global_batch=4 --train.eval_batches=3 "
                                  "--data.val_path=" + val + " --ckpt.dir=" + ckpt + " --log.metrics=" + metrics);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(metrics);
  std::string line;
  double val_loss = -1;
  while (std::getline(in, line))
    if (contains(line, "\"val_loss\"")) val_loss = std::stod(line.substr(line.find("\"val_loss\": ") + 12));
  const Result e = run_shardtrain("eval --ckpt " + ckpt + "/step_00000003 --data.path=" + val +
                                  " --train.eval_batches=3");
  ASSERT_EQ(e.code, 0) << e.output;
  const size_t at = e.output.find("loss ");
  ASSERT_NE(at, std::string::npos) << e.output;
  EXPECT_NEAR(std::stod(e.output.substr(at + 5)), val_loss, 1e-6) << e.output;
  EXPECT_TRUE(contains(e.output, "step 3")) << e.output;

  const Result bad = run_shardtrain("eval --ckpt " + ckpt + "/step_00000003 --model.n_embd=64");
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(contains(bad.output, "model.n_embd")) << bad.output;
  const Result missing = run_shardtrain("eval --ckpt " + (dir_ / "nope").string());
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(contains(missing.output, (dir_ / "nope").string())) << missing.output;
}

// The README's default run: the tiny model on the built-in corpus, on its defaults. Validation loss must
// fall below 2.3 nats/byte (uniform is ln 256 = 5.55).
TEST_F(Cli, DefaultRunLearnsTheCorpus) {
  const std::string metrics = (dir_ / "m.jsonl").string();
  const Result r = run_shardtrain("train --log.metrics=" + metrics);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(metrics);
  std::string line;
  int step_lines = 0;
  double last_val = 1e9;
  while (std::getline(in, line)) {
    if (contains(line, "\"val_loss\"")) {
      last_val = std::stod(line.substr(line.find("\"val_loss\": ") + 12));
    } else {
      ++step_lines;
      for (const char* k : {"\"step\"", "\"loss\"", "\"lr\"", "\"grad_norm\"", "\"tokens_per_s\""})
        ASSERT_TRUE(contains(line, k)) << k << " missing in " << line;
    }
  }
  // One record per step: as many as the run reports it took ("done: N steps").
  const size_t done = r.output.find("done: ");
  ASSERT_NE(done, std::string::npos) << r.output;
  EXPECT_EQ(step_lines, std::stoi(r.output.substr(done + 6)));
  EXPECT_GE(step_lines, 100);
  EXPECT_LT(last_val, 2.3) << r.output;
  EXPECT_TRUE(contains(r.output, "sample")) << r.output;
}

// The second default job: the tiny byte-level llama (configs/tiny-llama.ini) learns the built-in corpus as the GPT
// does (val_loss 2.18 after its 200 steps, measured on 2026-12-01; uniform is ln 256 = 5.55) and samples text.
TEST_F(Cli, TinyLlamaLearnsTheCorpus) {
  const Result r = run_shardtrain("train --config " + std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/tiny-llama.ini");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "model: llama, 4 layers, 4 heads (2 K/V heads)")) << r.output;
  const size_t val = r.output.rfind("val_loss ");
  ASSERT_NE(val, std::string::npos) << r.output;
  EXPECT_LT(std::stod(r.output.substr(val + 9)), 2.4) << r.output;
  EXPECT_TRUE(contains(r.output, "sample")) << r.output;
}

}  // namespace
