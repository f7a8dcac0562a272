// `shardtrain plan --gpu-mem X` against `shardtrain train --dist.max_gpu_mem_gib=X` on this GPU: for a GPT-2 and a
// Llama shape, at a cap 1 MiB above the planned device total and 1 MiB below it, plan says fits (exit 0) exactly when
// train starts and finishes its step (exit 0), and does not fit (exit 3) exactly when train refuses at start-up
// (exit 2, with the device plan's breakdown). The data is a small text file of the test's own.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "../common/gpu_test.h"
#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"
#include "shardtrain/core/config.h"
#include "shardtrain/shard/run_plan.h"

namespace st {
namespace {

struct Shape {
  const char* config;
  std::string overrides;
};

TEST(PlanGpu, VerdictIsWhetherTrainStarts) {
  ST_SKIP_WITHOUT_GPU();
  testing::TempDir dir;
  const std::string text = dir.str() + "/corpus.txt";
  {
    std::ofstream f(text);
    for (int i = 0; i < 4000; ++i) f << "line " << i << ": the quick brown fox jumps over the lazy dog.\n";
  }
  const std::string common =
      "--train.device=cuda --train.micro_batch=8 --train.global_batch=8 --model.seq_len=256 "
      "--data.format=text --data.path=" +
      text;
  const Shape shapes[] = {
      {"tiny.ini", "--model.n_layer=6 --model.n_embd=512 --model.n_head=8"},
      {"tiny-llama.ini",
       "--model.n_layer=6 --model.n_embd=512 --model.n_head=8 --model.n_kv_head=2 "
       "--model.ffn_dim=1408"},
  };
  for (const Shape& s : shapes) {
    const std::string cfg_path = std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/" + s.config;
    std::vector<std::string> overrides;
    for (const std::string& a : {common, s.overrides}) {
      size_t at = 0;
      while (at < a.size()) {
        const size_t end = a.find(' ', at);
        overrides.push_back(a.substr(at, end == std::string::npos ? std::string::npos : end - at));
        at = end == std::string::npos ? a.size() : end + 1;
      }
    }
    const Config c = load_config(cfg_path, overrides);
    const double planned_gib = double(planned_cuda_device(c, 1, false).total()) / double(int64_t{1} << 30);
    for (const double delta_mib : {1.0, -1.0}) {
      char gib[32];
      std::snprintf(gib, sizeof(gib), "%.6f", planned_gib + delta_mib / 1024);
      const std::string args = " --config " + cfg_path + " " + common + " " + s.overrides;
      const auto plan = testing::run_shardtrain("plan" + args + " --gpu-mem " + gib);
      const auto train = testing::run_command("cd " + dir.str() + " && " + SHARDTRAIN_BINARY + " train" + args +
                                              " --train.steps=1 --train.eval_every=0 --dist.max_gpu_mem_gib=" + gib);
      const std::string what =
          std::string(s.config) + " at " + gib + " GiB\nplan:\n" + plan.output + "\ntrain:\n" + train.output;
      ASSERT_TRUE(plan.code == 0 || plan.code == 3) << what;
      ASSERT_TRUE(train.code == 0 || train.code == 2) << what;
      EXPECT_EQ(plan.code == 0, train.code == 0) << what;
      EXPECT_EQ(plan.code == 0, delta_mib > 0) << what;  // the figure plan prints is the one start-up checks
      if (train.code == 2) EXPECT_NE(train.output.find("device memory: this config needs"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace st
