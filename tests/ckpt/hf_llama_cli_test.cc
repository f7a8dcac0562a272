// `shardtrain train --init.from=DIR` and `shardtrain ckpt export` on Hugging Face llama directories, as a user runs
// them: one process and three under mpirun start from the same model, a conflicting key exits 2 naming both sources,
// and the export writes a sharded bf16 directory.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "../common/run_shardtrain.h"
#include "ckpt_test_util.h"
#include "hf_dir_test_util.h"

namespace st {
namespace {

using testing::CliResult;
using testing::contains;
using testing::run_command;
using testing::run_shardtrain;

std::string train_args(const std::string& hf, const std::string& ckpt, const std::string& metrics) {
  return "train --init.from=" + hf + " --model.seq_len=16 --train.steps=1 --train.global_batch=6 "
         "--train.micro_batch=1 --train.eval_every=0 --train.sample_tokens=0 --ckpt.dir=" + ckpt +
         " --log.metrics=" + metrics;
}

// The loss of step 1 from a metrics file: the model as loaded, before any update.
double first_loss(const std::string& metrics) {
  std::ifstream in(metrics);
  std::string line;
  std::getline(in, line);
  return nlohmann::json::parse(line).at("loss").get<double>();
}

TEST(HfLlamaCliTest, OneAndThreeRanksStartFromTheSameModel) {
  if (run_command("command -v mpirun").code != 0) GTEST_SKIP() << "mpirun is not installed";
  testing::TempDir tmp;
  testing::Variant v;
  v.qwen2 = true;
  v.files = 2;
  v.dtype = "BF16";
  testing::write_hf_dir(tmp.file("hf"), v);

  CliResult one = run_shardtrain(train_args(tmp.file("hf"), tmp.file("ck1"), tmp.file("m1.jsonl")));
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_TRUE(contains(one.output, "init.from: weights loaded from " + tmp.file("hf"))) << one.output;
  const CliResult three = run_command(
      "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 timeout 300 mpirun "
      "--oversubscribe --bind-to none --mca btl self,vader -np 3 " + std::string(SHARDTRAIN_BINARY) + " " +
      train_args(tmp.file("hf"), tmp.file("ck3"), tmp.file("m3.jsonl")));
  ASSERT_EQ(three.code, 0) << three.output;
  // A random model of this shape starts near ln(300) = 5.70; the loaded one elsewhere, the same at both sizes.
  const double l1 = first_loss(tmp.file("m1.jsonl")), l3 = first_loss(tmp.file("m3.jsonl"));
  EXPECT_NEAR(l1, l3, 1e-5 * l1);
  EXPECT_GT(std::abs(l1 - 5.7038), 0.5) << "the loss of a random init: the weights were not loaded";

  // The 1-step checkpoint as a bf16 Hugging Face directory in several files.
  const CliResult ex = run_shardtrain("ckpt export " + tmp.file("ck3") + "/step_00000001 --out " + tmp.file("out") +
                                      " --dtype bf16 --max-shard-size 40KB");
  ASSERT_EQ(ex.code, 0) << ex.output;
  const nlohmann::json index =
      nlohmann::json::parse(std::ifstream(tmp.file("out") + "/model.safetensors.index.json"));
  EXPECT_EQ(index.at("weight_map").size(), testing::hf_tensors(v).size());
  const nlohmann::json cj = nlohmann::json::parse(std::ifstream(tmp.file("out") + "/config.json"));
  EXPECT_EQ(cj.at("architectures"), nlohmann::json::array({"Qwen2ForCausalLM"}));
  EXPECT_EQ(cj.at("torch_dtype"), "bfloat16");
  EXPECT_EQ(cj.at("max_position_embeddings"), 16);
  for (const auto& [name, bytes] : testing::tensor_bytes(tmp.file("out"))) EXPECT_EQ(bytes.substr(0, 5), "BF16:");

  // The export's options are checked.
  EXPECT_EQ(run_shardtrain("ckpt export " + tmp.file("ck3") + "/step_00000001 --out " + tmp.file("out2") +
                           " --dtype fp8").code,
            kExitBadInput);
}

TEST(HfLlamaCliTest, AConflictingKeyExitsTwoNamingBothSources) {
  testing::TempDir tmp;
  testing::write_hf_dir(tmp.file("hf"), testing::Variant{});
  std::ofstream(tmp.file("x.ini")) << "[model]\nn_kv_head = 4\n";
  const CliResult r = run_shardtrain("train --config " + tmp.file("x.ini") + " --init.from=" + tmp.file("hf") +
                                     " --train.steps=1");
  EXPECT_EQ(r.code, kExitBadInput) << r.output;
  EXPECT_TRUE(contains(r.output, "model.n_kv_head = 4 in " + tmp.file("x.ini") + ", 2 in " + tmp.file("hf") +
                                     "/config.json"))
      << r.output;
}

}  // namespace
}  // namespace st
