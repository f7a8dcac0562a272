// The shardtrain binary as a user runs it: exit codes, error messages and the default run end to end.
#include <gtest/gtest.h>

#include "../common/run_shardtrain.h"
#include <sys/wait.h>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/checkpoint_check.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/data/text_codec.h"
#include "shardtrain/model/sampling.h"
#include "shardtrain/train/step_engine.h"

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
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
  // A tiny byte-level GPT (configs/tiny.ini, seq_len 32, 8 sequences a step) trained for `steps` steps; returns its
  // checkpoint's step directory. 200 steps (a few seconds) take its greedy text from one byte repeated to a few.
  std::string train_tiny(int steps, const std::string& extra = "") {
    const std::string ckpt = (dir_ / "ckpt").string();
    const Result r =
        run_shardtrain("train --config " + std::string(SHARDTRAIN_SOURCE_DIR) +
                       "/configs/tiny.ini --train.sample_tokens=0 --model.seq_len=32 --train.micro_batch=8 "
                       "--train.global_batch=8 --train.eval_every=0 --train.eval_batches=1 --train.steps=" +
                       std::to_string(steps) + " --ckpt.dir=" + ckpt + " " + extra);
    EXPECT_EQ(r.code, 0) << r.output;
    char name[32];
    std::snprintf(name, sizeof(name), "/step_%08d", steps);
    return ckpt + name;
  }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << text;
    return p.string();
  }
  fs::path dir_;
};

bool contains(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// The greedy continuation of `seq` by checkpoint step_dir's model, each token the argmax of the sharded model's
// last_logits over the whole prefix: the full recompute, without a key/value cache.
std::vector<int32_t> greedy_by_recompute(const std::string& step_dir, std::vector<int32_t> seq, int n) {
  st::Config cfg = st::load_config_text(st::open_checkpoint(step_dir).config_ini, step_dir, {});
  cfg.train.micro_batch = cfg.train.global_batch = 1;
  st::SoloCommunicator comm;
  st::StepEngine engine(cfg, comm);
  st::load_checkpoint(step_dir, cfg, engine.sharded(), comm);
  std::vector<int32_t> out;
  std::vector<float> logits;
  for (int i = 0; i < n; ++i) {
    engine.sharded().last_logits(seq.data(), static_cast<int64_t>(seq.size()), &logits);
    out.push_back(st::argmax_token(logits));
    seq.push_back(out.back());
  }
  return out;
}

TEST_F(Cli, HelpListsEveryConfigKey) {
  const Result r = run_shardtrain("--help");
  EXPECT_EQ(r.code, 0);
  for (const char* key : {"model.n_layer", "model.n_head", "model.n_embd", "model.vocab_size", "model.seq_len",
                          "train.steps", "train.global_batch", "train.micro_batch", "train.seed", "train.eval_every",
                          "train.eval_batches", "optim.lr", "optim.min_lr", "optim.warmup_steps",
                          "optim.weight_decay", "optim.beta1", "optim.beta2", "optim.eps", "optim.grad_clip",
                          "data.path", "data.format", "data.val_path", "data.shuffle", "log.metrics", "log.every"})
    EXPECT_TRUE(contains(r.output, key)) << key;
  // The command list names both model families.
  EXPECT_TRUE(contains(r.output, "\n  train    train a GPT-2 or Llama-family model: shardtrain train [--config FILE] "
                                 "[--section.key=value ...]\n"))
      << r.output;
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
  // A read of the checkpoint, not a resume.
  EXPECT_TRUE(contains(e.output, "checkpoint: loaded step 3 from " + ckpt +
                                     "/step_00000003 (written by 1 rank(s), read by 1)\n"))
      << e.output;
  EXPECT_FALSE(contains(e.output, "resumed from")) << e.output;

  const Result bad = run_shardtrain("eval --ckpt " + ckpt + "/step_00000003 --model.n_embd=64");
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(contains(bad.output, "model.n_embd")) << bad.output;
  const Result missing = run_shardtrain("eval --ckpt " + (dir_ / "nope").string());
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(contains(missing.output, (dir_ / "nope").string())) << missing.output;
}

// optim.decay and optim.decay_steps reach the steps: the learning rate each step logs, over a warmup of 2, optim.lr
// held, then a linear decay over the last 5 of 12 steps.
TEST_F(Cli, LoggedLearningRatesFollowTheWarmupStableDecaySchedule) {
  const std::string metrics = (dir_ / "m.jsonl").string();
  const Result r = run_shardtrain("train --config " + std::string(SHARDTRAIN_SOURCE_DIR) +
                                  "/configs/tiny.ini --train.steps=12 --train.sample_tokens=0 --train.eval_every=0 "
                                  "--model.seq_len=32 --train.micro_batch=4 --train.global_batch=4 --optim.lr=0.001 "
                                  "--optim.min_lr=0 --optim.warmup_steps=2 --optim.decay=linear "
                                  "--optim.decay_steps=5 --log.metrics=" +
                                  metrics);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(metrics);
  std::string line;
  std::vector<double> lrs;
  while (std::getline(in, line))
    if (contains(line, "\"lr\"")) lrs.push_back(std::stod(line.substr(line.find("\"lr\": ") + 6)));
  const std::vector<double> want = {5e-4, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 8e-4, 6e-4, 4e-4, 2e-4};
  ASSERT_EQ(lrs.size(), want.size()) << r.output;
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(lrs[i], want[i], 1e-9) << "step " << i + 1;
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
// does (val_loss about 2.2 after its 200 steps, README's figure; uniform is ln 256 = 5.55) and samples text.
TEST_F(Cli, TinyLlamaLearnsTheCorpus) {
  const Result r = run_shardtrain("train --config " + std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/tiny-llama.ini");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "model: llama, 4 layers, 4 heads (2 K/V heads)")) << r.output;
  const size_t val = r.output.rfind("val_loss ");
  ASSERT_NE(val, std::string::npos) << r.output;
  EXPECT_LT(std::stod(r.output.substr(val + 9)), 2.4) << r.output;
  EXPECT_TRUE(contains(r.output, "sample")) << r.output;
}

// `generate` on a byte-level checkpoint: the same flags give the same text; greedy decoding with the key/value cache
// prints what the full recompute's argmax gives; the summary line goes to stderr.
TEST_F(Cli, GenerateIsDeterministicAndGreedyIsTheFullRecompute) {
  const std::string step = train_tiny(200);
  const std::string sample =
      "generate --ckpt " + step + " --prompt 'The q' --max-tokens 40 --temperature 0.9 --top-k 20";
  const Result a = run_shardtrain(sample + " --seed 3 2>/dev/null");
  const Result b = run_shardtrain(sample + " --seed=3 2>/dev/null");
  const Result c = run_shardtrain(sample + " --seed 4 2>/dev/null");
  ASSERT_EQ(a.code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_NE(a.output, c.output);
  // 5 + 20 bytes: within the 32 positions, so no slide. stdout holds the text alone, stderr the summary.
  const std::string greedy = "generate --ckpt " + step + " --prompt 'The q' --max-tokens 20 --temperature 0";
  const Result g = run_shardtrain(greedy + " 2>/dev/null");
  ASSERT_EQ(g.code, 0) << g.output;
  const st::ByteCodec bytes;
  const std::vector<int32_t> ids = greedy_by_recompute(step, bytes.encode("The q"), 20);
  EXPECT_GE(std::set<int32_t>(ids.begin(), ids.end()).size(), 3u);  // a real sequence, not one byte repeated
  const std::string want = bytes.decode(ids) + "\n";
  EXPECT_EQ(g.output, want);
  const Result summary = run_shardtrain(greedy + " 2>&1 >/dev/null");
  EXPECT_TRUE(contains(summary.output, "generate: " + step + " (step 200) on cpu/fp32: load ") &&
              contains(summary.output, " s, prefill 5 tokens in "))
      << summary.output;
  EXPECT_TRUE(contains(summary.output, "decode 19 tokens in ") && contains(summary.output, " tokens/s)"))
      << summary.output;
  // generate reads the checkpoint's weights: the log says it loaded them, not that a run resumed.
  EXPECT_TRUE(contains(summary.output, "checkpoint: loaded step 200 from " + step +
                                           " (written by 1 rank(s), read by 1)\n"))
      << summary.output;
  EXPECT_FALSE(contains(summary.output, "resumed from")) << summary.output;
  // top-k 1 at any temperature is greedy.
  EXPECT_EQ(run_shardtrain(greedy + " --top-k 1 --temperature 3 2>/dev/null").output, want);
  // Past seq_len the context slides (at 5 + 27 tokens, then every 16) and generation goes on.
  const std::string longer = "generate --ckpt " + step + " --prompt 'The q' --max-tokens 70 --temperature 0";
  const Result l = run_shardtrain(longer + " 2>/dev/null");
  ASSERT_EQ(l.code, 0) << l.output;
  EXPECT_EQ(l.output.substr(0, want.size() - 1), want.substr(0, want.size() - 1));
  EXPECT_TRUE(contains(run_shardtrain(longer + " 2>&1 >/dev/null").output, "the context slid 3 time(s)"));
}

TEST_F(Cli, GenerateHelpListsItsFlags) {
  const Result r = run_shardtrain("generate --help");
  EXPECT_EQ(r.code, 0);
  for (const char* flag : {"--ckpt DIR", "--prompt TEXT", "--prompt-ids LIST", "--prompts FILE", "--chat", "--stop STR",
                           "--jsonl", "--max-tokens N", "--temperature T", "--top-k K", "--seed S",
                           "--split auto|layers|none", "--train.device=cpu|cuda"})
    EXPECT_TRUE(contains(r.output, flag)) << flag << " missing in " << r.output;
  EXPECT_TRUE(contains(run_shardtrain("--help").output, "  generate text from a checkpoint"));
}

TEST_F(Cli, GenerateRefusesBadFlagsNamingThem) {
  const std::string no_ckpt = "generate --ckpt " + (dir_ / "nope").string() + " --prompt hi ";
  for (const auto& [args, names] : std::vector<std::pair<std::string, std::string>>{
           {"--temperature -1", "--temperature"},
           {"--temperature hot", "--temperature"},
           {"--top-k -2", "--top-k"},
           {"--top-k 2.5", "--top-k"},
           {"--max-tokens 0", "--max-tokens"},
           {"--max-tokens", "--max-tokens"},
           {"--seed -1", "--seed"},
           {"--split pipeline", "--split 'pipeline' is not a split (expected auto, layers or none)"},
           {"--topk 3", "--topk"},
           {"--prompt-ids 1,2", "both"}}) {
    const Result r = run_shardtrain(no_ckpt + args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.output;
    EXPECT_TRUE(contains(r.output, names)) << args << ": " << r.output;
  }
  const Result no_prompt = run_shardtrain("generate --ckpt " + (dir_ / "nope").string());
  EXPECT_EQ(no_prompt.code, 2);
  EXPECT_TRUE(contains(no_prompt.output, "--prompt")) << no_prompt.output;
  const Result no_dir = run_shardtrain("generate --prompt hi");
  EXPECT_EQ(no_dir.code, 2);
  EXPECT_TRUE(contains(no_dir.output, "--ckpt")) << no_dir.output;
  const Result missing = run_shardtrain(no_ckpt);
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(contains(missing.output, (dir_ / "nope").string())) << missing.output;

  // What needs the checkpoint's model: a prompt past seq_len, an id past the vocabulary, a changed model key.
  const std::string step = train_tiny(1);
  const Result too_long = run_shardtrain("generate --ckpt " + step + " --prompt '" + std::string(33, 'a') + "'");
  EXPECT_EQ(too_long.code, 2);
  EXPECT_TRUE(contains(too_long.output, "--prompt holds 33 tokens") && contains(too_long.output, "model.seq_len"))
      << too_long.output;
  const Result bad_id = run_shardtrain("generate --ckpt " + step + " --prompt-ids 1,256");
  EXPECT_EQ(bad_id.code, 2);
  EXPECT_TRUE(contains(bad_id.output, "--prompt-ids") && contains(bad_id.output, "[0, 256)")) << bad_id.output;
  const Result model = run_shardtrain("generate --ckpt " + step + " --prompt hi --model.n_embd=64");
  EXPECT_EQ(model.code, 2);
  EXPECT_TRUE(contains(model.output, "model.n_embd")) << model.output;
}

// A vocabulary other than bytes: --prompt needs a tokenizer and is refused; --prompt-ids works and prints ids, the
// greedy ones equal to the full recompute's.
TEST_F(Cli, GenerateWithoutATokenizerTakesIds) {
  const std::string step = train_tiny(200, "--model.vocab_size=300");
  const Result text = run_shardtrain("generate --ckpt " + step + " --prompt hi");
  EXPECT_EQ(text.code, 2);
  EXPECT_TRUE(contains(text.output, "tokenizer") && contains(text.output, "--prompt-ids")) << text.output;
  const Result ids = run_shardtrain("generate --ckpt " + step + " --prompt-ids 72,299,32 --max-tokens 12 "
                                    "--temperature 0 2>/dev/null");
  ASSERT_EQ(ids.code, 0) << ids.output;
  const std::vector<int32_t> greedy = greedy_by_recompute(step, {72, 299, 32}, 12);
  EXPECT_GE(std::set<int32_t>(greedy.begin(), greedy.end()).size(), 3u);
  std::string want;
  for (int32_t t : greedy) want += (want.empty() ? "" : ",") + std::to_string(t);
  EXPECT_EQ(ids.output, want + "\n");
}

}  // namespace
