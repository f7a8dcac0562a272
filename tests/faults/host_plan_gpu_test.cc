// A CUDA run whose offloaded optimizer state the host cannot hold: the host plan (shard/host_plan.h) refuses it at
// start-up with exit 2, the breakdown and the limit that binds, before anything large is allocated (without the plan
// the kernel's OOM killer ends such a run), and the ckpt.dir it would have used is left as it was: not created.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"

namespace st {
namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(HostPlanFaults, AnOffloadTheHostCannotHoldExits2AndLeavesNothing) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  st::testing::TempDir tmp;
  const std::string text = tmp.file("corpus.txt"), ckpt = tmp.file("run/ckpt");
  {
    std::ofstream f(text);
    for (int i = 0; i < 4096; ++i) f << "line " << i << " of a corpus that only has to exist\n";
  }
  // A 1.5B-parameter llama (24 blocks of 63M): its offloaded fp32 master and moments alone are 16.88 GiB of host
  // memory, more than the 12 GiB data segment below; the device holds only its gradients and bf16 copy.
  const std::string args = "train --config " SHARDTRAIN_SOURCE_DIR
                           "/configs/tiny-llama.ini --train.device=cuda --train.dtype=bf16 --train.steps=1 "
                           "--model.n_layer=24 --model.n_embd=2048 --model.n_head=16 --model.n_kv_head=8 "
                           "--model.ffn_dim=8192 --train.micro_batch=1 --train.global_batch=1 "
                           "--optim.offload=optimizer --data.format=text --data.path=" +
                           text + " --ckpt.dir=" + ckpt;
  const st::testing::CliResult r = st::testing::run_shardtrain(args, "ulimit -d 12582912 && exec");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "host memory: this config needs ")) << r.output;
  EXPECT_TRUE(contains(r.output, " per rank (optimizer state 16.88 GiB")) << r.output;
  EXPECT_TRUE(contains(r.output, "but the data-segment limit (RLIMIT_DATA, ulimit -d) of 12.00 GiB")) << r.output;
  // With a ckpt.dir and background saves (ckpt.async, the default), units kept on the device are copied to pinned host
  // memory for each save: offloading less does not help, more ranks do.
  EXPECT_TRUE(contains(r.output, "; it fits with 4 ranks on 4 host(s) of this size")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("run"))) << "the refused run left its ckpt.dir behind";
}

}  // namespace
}  // namespace st
