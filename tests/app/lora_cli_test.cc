// LoRA through the shardtrain binary: a run from exported weights (init.from) checkpoints its adapters, resumes and
// evaluates on the same base, refuses a base whose file changed (naming it), and exports the adapters in PEFT's
// layout.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../common/run_shardtrain.h"

namespace fs = std::filesystem;

namespace {

using st::testing::CliResult;
using st::testing::run_shardtrain;

class LoraCli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("shardtrain_lora_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  CliResult train(int steps, const std::string& extra) {
    return run_shardtrain("train --config " + std::string(SHARDTRAIN_SOURCE_DIR) +
                          "/configs/tiny.ini --train.sample_tokens=0 --model.seq_len=32 --train.micro_batch=8 "
                          "--train.global_batch=8 --train.eval_every=0 --train.eval_batches=1 --train.steps=" +
                          std::to_string(steps) + " " + extra);
  }

  fs::path dir_;
};

TEST_F(LoraCli, AdaptersCheckpointResumeOnTheirBaseAndExportForPeft) {
  // The base: a model trained in full and exported.
  ASSERT_EQ(train(2, "--ckpt.export=" + path("base.h5")).code, 0);
  const std::string lora = "--init.from=" + path("base.h5") + " --lora.rank=4 --lora.alpha=8 --lora.targets=qkv,fc " +
                           "--ckpt.dir=" + path("ck") + " --ckpt.async=false --ckpt.every=2";
  CliResult r = train(2, lora);
  ASSERT_EQ(r.code, 0) << r.output;
  r = train(4, lora);  // resumes step 2
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("LoRA base read from " + path("base.h5")), std::string::npos) << r.output;
  r = run_shardtrain("eval --ckpt " + path("ck/step_00000004") + " --train.eval_batches=1");
  EXPECT_EQ(r.code, 0) << r.output;

  // The adapters in PEFT's layout: config and one A and B per adapted layer of each block.
  r = run_shardtrain("ckpt export " + path("ck/step_00000004") + " --adapter " + path("adapter"));
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream config(path("adapter/adapter_config.json"));
  const std::string text((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
  for (const char* field : {"\"peft_type\": \"LORA\"", "\"r\": 4", "\"lora_alpha\": 8.0",
                            "\"task_type\": \"CAUSAL_LM\"", "\"attn.c_attn\"", "\"mlp.c_fc\"", "\"use_rslora\": false"})
    EXPECT_NE(text.find(field), std::string::npos) << field << " in " << text;
  EXPECT_TRUE(fs::exists(path("adapter/adapter_model.safetensors")));
  // A full fine-tuning checkpoint has no adapters to export.
  ASSERT_EQ(train(2, "--ckpt.dir=" + path("full")).code, 0);
  r = run_shardtrain("ckpt export " + path("full/step_00000002") + " --adapter " + path("adapter2"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("trained the whole model"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(path("adapter2")));

  // The base is replaced by another model's weights under the same name: the adapters no longer apply, and the run
  // says which file changed.
  fs::remove(path("base.h5"));
  ASSERT_EQ(train(3, "--ckpt.export=" + path("base.h5")).code, 0);
  r = train(6, lora);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("the base file base.h5 in init.from " + path("base.h5") + " changed"), std::string::npos)
      << r.output;
  r = run_shardtrain("eval --ckpt " + path("ck/step_00000004") + " --train.eval_batches=1");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("base.h5"), std::string::npos) << r.output;
}

}  // namespace
