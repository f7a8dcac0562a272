// Every writer writes only new files: `ckpt export` (GPT-2 and llama), the trainer's ckpt.export and `plot --out`
// refuse a target that exists with exit code 2, naming it, and leave it and everything else as it was. (tokenize's
// refusals are in tests/text/tokenize_job_test.cc and tests/faults/tokenize_faults.sh.)
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"

namespace fs = std::filesystem;

namespace st::testing {
namespace {

const std::string kConfigs = std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/";

// A one-step run of a small model of `config` (tiny.ini: GPT-2, tiny-llama.ini: llama), `extra` appended.
std::string small_run(const std::string& config, const std::string& extra) {
  return "train --config " + kConfigs + config +
         " --model.n_layer=1 --model.n_embd=32 --model.n_head=2 --model.seq_len=16 --train.micro_batch=1 "
         "--train.global_batch=1 --train.eval_batches=1 --train.sample_tokens=0 --train.steps=1 " +
         extra;
}

// step_00000001 of a one-step run of `config` under dir/ckpt.
std::string committed_step(const TempDir& dir, const std::string& config) {
  const std::string extra = config == "tiny-llama.ini" ? "--model.n_kv_head=2 --model.ffn_dim=64 " : "";
  const CliResult r =
      run_shardtrain(small_run(config, extra + "--ckpt.dir=" + dir.file("ckpt")), "OMP_NUM_THREADS=1 exec");
  EXPECT_EQ(r.code, 0) << r.output;
  return dir.file("ckpt/step_00000001");
}

bool has(const std::string& output, const std::string& what) { return output.find(what) != std::string::npos; }

// The reproduction: a config.json of the user's beside --out is neither overwritten nor joined by the weights.
TEST(OutputTargets, GptExportRefusesAConfigJsonItWasNotAskedToWrite) {
  TempDir dir;
  const std::string step = committed_step(dir, "tiny.ini");
  fs::create_directory(dir.file("d"));
  write_bytes(dir.file("d/config.json"), "{\"mine\": true}\n");
  for (const char* name : {"model.safetensors", "model.h5"}) {
    SCOPED_TRACE(name);
    const CliResult r = run_shardtrain("ckpt export " + step + " --out " + dir.file("d/") + name);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_TRUE(has(r.output, dir.file("d/config.json") + " exists")) << r.output;
    EXPECT_EQ(read_bytes(dir.file("d/config.json")), "{\"mine\": true}\n");
    EXPECT_EQ(std::distance(fs::directory_iterator(dir.file("d")), fs::directory_iterator()), 1) << "files written";
  }
}

TEST(OutputTargets, GptExportRefusesAnExistingOut) {
  TempDir dir;
  const std::string step = committed_step(dir, "tiny.ini");
  fs::create_directory(dir.file("d"));
  for (const char* name : {"model.safetensors", "model.h5"}) {
    SCOPED_TRACE(name);
    const std::string out = dir.file("d/") + name;
    write_bytes(out, "keep me");
    const CliResult r = run_shardtrain("ckpt export " + step + " --out " + out);
    EXPECT_EQ(r.code, 2) << r.output;
    EXPECT_TRUE(has(r.output, "ckpt export --out " + out + ": exists")) << r.output;
    EXPECT_TRUE(read_bytes(out) == "keep me") << "the file at --out changed";
    EXPECT_FALSE(fs::exists(dir.file("d/config.json")));
    fs::remove(out);
  }
  // Into a new place the export goes through, and a second one over it is refused.
  const std::string out = dir.file("d/model.safetensors");
  CliResult r = run_shardtrain("ckpt export " + step + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.output;
  const std::string weights = read_bytes(out);
  fs::remove(dir.file("d/config.json"));
  r = run_shardtrain("ckpt export " + step + " --out " + out);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_FALSE(fs::exists(dir.file("d/config.json"))) << "written although the weights were refused";
  EXPECT_TRUE(read_bytes(out) == weights) << "the first export changed";
}

// The llama directory export: a new or empty directory; a file or directory of the user's named DIR.tmp is not
// taken for the export's own temporary.
TEST(OutputTargets, LlamaExportTouchesNothingOfTheUsers) {
  TempDir dir;
  const std::string step = committed_step(dir, "tiny-llama.ini");
  fs::create_directory(dir.file("hf.tmp"));
  write_bytes(dir.file("hf.tmp/notes.txt"), "mine");
  CliResult r = run_shardtrain("ckpt export " + step + " --out " + dir.file("hf"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_bytes(dir.file("hf.tmp/notes.txt")), "mine");
  EXPECT_TRUE(fs::exists(dir.file("hf/config.json")));
  EXPECT_TRUE(fs::exists(dir.file("hf/model.safetensors")));
  // Over the export just written: refused, naming the directory.
  r = run_shardtrain("ckpt export " + step + " --out " + dir.file("hf"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "ckpt export --out " + dir.file("hf") + ": exists and is not empty")) << r.output;
}

// ckpt.export is refused before step 1, not after the run.
TEST(OutputTargets, TrainRefusesAnExistingCkptExportBeforeStep1) {
  TempDir dir;
  write_bytes(dir.file("final.h5"), "keep me");
  const CliResult r =
      run_shardtrain(small_run("tiny.ini", "--ckpt.export=" + dir.file("final.h5")), "OMP_NUM_THREADS=1 exec");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "ckpt.export " + dir.file("final.h5") + ": exists")) << r.output;
  EXPECT_FALSE(has(r.output, "step      1/1")) << r.output;
  EXPECT_EQ(read_bytes(dir.file("final.h5")), "keep me");
}

// plot replaces a chart it drew (a refreshed plot of a growing metrics file), and refuses any other file.
TEST(OutputTargets, PlotReplacesItsOwnChartAndRefusesAnyOtherFile) {
  TempDir dir;
  const CliResult run =
      run_shardtrain(small_run("tiny.ini", "--log.metrics=" + dir.file("m.jsonl")), "OMP_NUM_THREADS=1 exec");
  ASSERT_EQ(run.code, 0) << run.output;
  CliResult r = run_shardtrain("plot " + dir.file("m.jsonl"));
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_shardtrain("plot " + dir.file("m.jsonl"));
  EXPECT_EQ(r.code, 0) << "a second plot over its own chart: " << r.output;
  write_bytes(dir.file("notes.svg"), "<svg>my drawing</svg>");
  r = run_shardtrain("plot " + dir.file("m.jsonl") + " --out " + dir.file("notes.svg"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(has(r.output, "plot --out " + dir.file("notes.svg") + ": exists and is not a chart plot drew"))
      << r.output;
  EXPECT_EQ(read_bytes(dir.file("notes.svg")), "<svg>my drawing</svg>");
}

}  // namespace
}  // namespace st::testing
