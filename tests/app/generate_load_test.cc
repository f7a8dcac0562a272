// `shardtrain generate` reads the weights alone (ckpt/decode_weights.h), through the binary as a user runs it: from a
// checkpoint it decodes the tokens a training engine that loads the checkpoint decodes (StepEngine::generate), greedy
// and sampled; from init.from the tokens of a checkpoint that holds the same weights; and it refuses both or neither
// source, a missing rank file, a missing parameter dataset and a changed LoRA base, naming the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "../ckpt/ckpt_test_util.h"
#include "../ckpt/hf_dir_test_util.h"
#include "../common/byte_tokenizer.h"
#include "../common/run_shardtrain.h"
#include "generate_cli_util.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/ckpt/checkpoint_check.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/sampling.h"
#include "shardtrain/train/step_engine.h"

namespace fs = std::filesystem;

namespace st {
namespace {

using testing::CliResult;
using testing::contains;
using testing::parse_ids;
using testing::run_shardtrain;

constexpr const char* kPrompt = "72,104,101,32,113";

// The sampling flags of the comparisons and the same as options: greedy, top-k and plain sampling.
struct Sampling {
  std::string flags;
  SamplingOptions options;
};
std::vector<Sampling> samplings() {
  std::vector<Sampling> out(3);
  out[0].flags = "--temperature 0";
  out[0].options.temperature = 0;
  out[1].flags = "--temperature 0.9 --top-k 20 --seed 7";
  out[1].options.temperature = 0.9;
  out[1].options.top_k = 20;
  out[1].options.seed = 7;
  out[2].flags = "--temperature 1.2 --seed 3";
  out[2].options.temperature = 1.2;
  out[2].options.seed = 3;
  return out;
}

// The ids `generate` prints for kPrompt (stdout only); a failure when it does not exit 0.
std::vector<int32_t> generated(const std::string& source, const std::string& flags, int n) {
  const CliResult r = run_shardtrain("generate " + source + " --prompt-ids " + kPrompt + " --max-tokens " +
                                     std::to_string(n) + " " + flags + " 2>/dev/null");
  EXPECT_EQ(r.code, 0) << source << " " << flags << ": " << r.output;
  return r.code == 0 ? parse_ids(r.output) : std::vector<int32_t>{};
}

// What a one-rank training engine that loads step_dir decodes for kPrompt: the weights gathered from its shards, the
// adapters merged in, and the same decoder and sampling (StepEngine::generate).
std::vector<int32_t> engine_tokens(const std::string& step_dir, const SamplingOptions& o, int n) {
  Config cfg = load_config_text(open_checkpoint(step_dir).config_ini, step_dir, {});
  cfg.train.micro_batch = cfg.train.global_batch = 1;
  SoloCommunicator comm;
  StepEngine engine(cfg, comm);
  load_checkpoint(step_dir, cfg, engine.sharded(), comm, CheckpointLoad::kRead);
  return engine.generate(parse_ids(kPrompt), n, o);
}

class GenerateLoad : public ::testing::Test {
 protected:
  // configs/NAME trained for 12 steps into a checkpoint under `ckpt` with `extra` keys: its step directory.
  std::string train(const std::string& name, const std::string& ckpt, const std::string& extra = "") {
    const CliResult r =
        run_shardtrain("train --config " + std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/" + name +
                       " --train.sample_tokens=0 --model.seq_len=32 --train.micro_batch=4 --train.global_batch=4 "
                       "--train.eval_every=0 --train.eval_batches=1 --train.steps=12 --ckpt.dir=" +
                       tmp_.file(ckpt) + " " + extra);
    EXPECT_EQ(r.code, 0) << r.output;
    return tmp_.file(ckpt) + "/step_00000012";
  }
  // c's model after init.from, saved by one rank as a step-1 checkpoint under c.ckpt.dir: its step directory.
  static std::string save_init_from(const Config& c) {
    SoloCommunicator solo;
    StepEngine e(c, solo);
    init_from_weights(c.init.from, c.model, e.sharded());
    CheckpointState cs;
    cs.step = 1;
    return save_checkpoint(c, e.sharded(), cs, solo);
  }
  testing::TempDir tmp_;
};

// The summary's load and the parts it ends with (opening the device and planning, making the decoder, reading the
// weights, handing them over): each at least 0, and together the load, to the printed figures' rounding.
void expect_load_parts(const std::string& output) {
  const std::regex summary(R"(load ([0-9.]+) s, prefill .*; the load: ([0-9.]+) s opening the device and planning, )"
                           R"(([0-9.]+) s making the decoder, ([0-9.-]+) s reading the weights, ([0-9.]+) s handing )"
                           R"(them over\n)");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(output, m, summary)) << output;
  double parts = 0;
  for (size_t k = 2; k <= 5; ++k) {
    EXPECT_GE(std::stod(m[k].str()), 0.0) << output;
    parts += std::stod(m[k].str());
  }
  EXPECT_NEAR(parts, std::stod(m[1].str()), 0.003) << output;  // five roundings to 0.0005 s
}

// A gpt2 and a llama checkpoint, a LoRA one on a base read from a file and a QLoRA llama on the seed's base: every
// token as the engine decodes it, with each sampling; the summary names the checkpoint and its step, and the load.
TEST_F(GenerateLoad, CheckpointTokensAreTheEngines) {
  const std::string gpt2 = train("tiny.ini", "gpt2", "--ckpt.export=" + tmp_.file("base.h5"));
  const std::vector<std::string> steps = {
      gpt2, train("tiny-llama.ini", "llama"),
      train("tiny.ini", "lora", "--init.from=" + tmp_.file("base.h5") + " --lora.rank=4 --lora.targets=qkv,fc"),
      train("tiny-llama.ini", "qlora", "--lora.rank=2 --lora.base_dtype=nf4")};
  for (const std::string& step : steps) {
    for (const Sampling& s : samplings()) {
      const std::vector<int32_t> want = engine_tokens(step, s.options, 40);
      ASSERT_EQ(want.size(), 40u);
      EXPECT_EQ(generated("--ckpt " + step, s.flags, 40), want) << step << " " << s.flags;
    }
    const CliResult r = run_shardtrain("generate --ckpt " + step + " --prompt-ids 72 --max-tokens 2 2>&1 >/dev/null");
    EXPECT_TRUE(contains(r.output, "generate: " + step + " (step 12) on cpu/fp32: load ")) << r.output;
    EXPECT_TRUE(contains(r.output, " s, prefill 1 tokens in ")) << r.output;
    expect_load_parts(r.output);
  }
}

// init.from decodes what a checkpoint of the same weights decodes: Hugging Face directories (tied llama in F32, untied
// qwen2 in BF16 over two files) and a GPT-2 file; a directory's tokenizer.json reads --prompt unless --tokenizer names
// another.
TEST_F(GenerateLoad, InitFromTokensAreThoseOfACheckpointOfTheSameWeights) {
  testing::Variant qwen;
  qwen.qwen2 = true;
  qwen.tied = false;
  qwen.dtype = "BF16";
  qwen.files = 2;
  std::vector<std::string> sources;
  for (const testing::Variant& v : {testing::Variant{}, qwen}) {
    const std::string dir = tmp_.file("hf" + std::to_string(sources.size()));
    testing::write_hf_dir(dir, v);
    sources.push_back(dir);
  }
  sources.push_back(tmp_.file("gpt2.h5"));
  testing::write_seed_model(Config{}, sources.back());  // the built-in defaults' model
  for (const std::string& source : sources) {
    const bool dir = fs::is_directory(source);
    const std::string seq = dir ? " --model.seq_len=16" : "";
    std::vector<std::string> keys = {"--init.from=" + source, "--ckpt.dir=" + source + ".ckpt"};
    if (dir) keys.push_back("--model.seq_len=16");
    const std::string step = save_init_from(load_config(std::nullopt, keys));
    for (const Sampling& s : samplings()) {
      const std::vector<int32_t> want = generated("--ckpt " + step, s.flags, 30);
      ASSERT_EQ(want.size(), 30u) << source;
      EXPECT_EQ(generated("--init.from " + source + seq, s.flags, 30), want) << source << " " << s.flags;
    }
    const CliResult r =
        run_shardtrain("generate --init.from=" + source + seq + " --prompt-ids 72 --max-tokens 2 2>&1 >/dev/null");
    EXPECT_TRUE(contains(r.output, "init.from: weights loaded from " + source)) << r.output;
    EXPECT_TRUE(contains(r.output, "generate: " + source + " (init.from) on cpu/fp32: load ")) << r.output;
  }
  // Text: without a tokenizer a 300-token model takes ids only; with tokenizer.json in the directory, --prompt reads
  // through it, as --tokenizer with that file does for the checkpoint.
  const std::string text = " --prompt 'The q' --max-tokens 12 --temperature 0";
  const CliResult none = run_shardtrain("generate --init.from " + sources[0] + " --model.seq_len=16" + text);
  EXPECT_EQ(none.code, kExitBadInput) << none.output;
  EXPECT_TRUE(contains(none.output, "--prompt TEXT needs a tokenizer")) << none.output;
  const std::string tokenizer = sources[0] + "/tokenizer.json";
  std::ofstream(tokenizer) << testing::byte_tokenizer_json({"<|endoftext|>"}).dump();
  const CliResult own =
      run_shardtrain("generate --init.from " + sources[0] + " --model.seq_len=16" + text + " 2>/dev/null");
  ASSERT_EQ(own.code, 0) << own.output;
  const CliResult given = run_shardtrain("generate --ckpt " + sources[0] + ".ckpt/step_00000001 --tokenizer " +
                                         tokenizer + text + " 2>/dev/null");
  ASSERT_EQ(given.code, 0) << given.output;
  EXPECT_EQ(own.output, given.output);
  EXPECT_GT(own.output.size(), 1u);
}

TEST_F(GenerateLoad, BadSourcesAreRefusedNamingThem) {
  const std::string step = train("tiny.ini", "gpt2", "--ckpt.export=" + tmp_.file("base.h5"));
  // Neither source, or both for a checkpoint of the whole model.
  CliResult r = run_shardtrain("generate --prompt-ids 1,2");
  EXPECT_EQ(r.code, kExitBadInput) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "shardtrain generate needs weights: --ckpt DIR (a committed step directory) or "
                       "--init.from PATH"))
      << r.output;
  r = run_shardtrain("generate --ckpt " + step + " --init.from " + tmp_.file("base.h5") + " --prompt-ids 1,2");
  EXPECT_EQ(r.code, kExitBadInput) << r.output;
  EXPECT_TRUE(contains(r.output, "takes its weights from --ckpt DIR or from --init.from PATH, not both: " + step +
                                     " holds a whole model"))
      << r.output;
  r = run_shardtrain("generate --init.from= --prompt-ids 1,2");
  EXPECT_EQ(r.code, kExitBadInput) << r.output;
  EXPECT_TRUE(contains(r.output, "--init.from is empty")) << r.output;

  // A LoRA checkpoint's base moved: --init.from names it where it is now; replaced by other weights, it is refused
  // naming the file.
  const std::string lora =
      train("tiny.ini", "lora", "--init.from=" + tmp_.file("base.h5") + " --lora.rank=4 --lora.targets=qkv");
  const std::vector<int32_t> before = generated("--ckpt " + lora, "--temperature 0", 10);
  fs::rename(tmp_.file("base.h5"), tmp_.file("moved.h5"));
  r = run_shardtrain("generate --ckpt " + lora + " --prompt-ids 1,2");
  EXPECT_EQ(r.code, kExitBadInput) << r.output;
  EXPECT_TRUE(contains(r.output, tmp_.file("base.h5"))) << r.output;
  fs::create_directories(tmp_.file("elsewhere"));
  fs::rename(tmp_.file("moved.h5"), tmp_.file("elsewhere/base.h5"));
  EXPECT_EQ(generated("--ckpt " + lora + " --init.from=" + tmp_.file("elsewhere/base.h5"), "--temperature 0", 10),
            before);
  testing::write_seed_model(Config{}, tmp_.file("base.h5"));  // the seed's model: not the trained base
  r = run_shardtrain("generate --ckpt " + lora + " --prompt-ids 1,2");
  EXPECT_EQ(r.code, kExitBadInput) << r.output;
  EXPECT_TRUE(contains(r.output, "the base file base.h5 in init.from " + tmp_.file("base.h5") + " changed"))
      << r.output;

  // A parameter dataset gone from a rank file that keeps its size, then the rank file itself.
  const std::string file = step + "/rank_00000.h5";
  testing::remove_dataset_keeping_size(file, "/units/head/param");
  r = run_shardtrain("generate --ckpt " + step + " --prompt-ids 1,2");
  EXPECT_EQ(r.code, kExitBadInput) << r.output;
  EXPECT_TRUE(contains(r.output, file + ": dataset /units/head/param is missing")) << r.output;
  fs::remove(file);
  r = run_shardtrain("generate --ckpt " + step + " --prompt-ids 1,2");
  EXPECT_EQ(r.code, kExitBadInput) << r.output;
  EXPECT_TRUE(contains(r.output, file + ": missing (the manifest lists it as rank 0's file")) << r.output;
}

}  // namespace
}  // namespace st
