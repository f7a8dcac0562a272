// A config the host cannot hold: the CPU backend plans its memory before it allocates (shard/memory_plan.h) and
// refuses at start-up with the plan's breakdown and the limit that binds (exit 2), instead of allocating and
// initialising until std::bad_alloc ends the run as an internal error.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"
#include "shardtrain/ckpt/safetensors.h"

namespace st {
namespace {

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The CPU backend, whose host plan is under test, also in a CUDA build on a machine with a GPU.
const std::string kTiny =
    "train --config " SHARDTRAIN_SOURCE_DIR "/configs/tiny.ini --train.steps=1 --train.device=cpu ";

TEST(MemoryPlanFaults, AHugeEmbeddingIsRefusedWithTheBreakdown) {
  // n_embd 65536: 12 x 4 x 65536^2 parameters, 3 TiB of sharded state; no test machine has that. The ckpt.dir it
  // names is left as it was found: not created.
  st::testing::TempDir tmp;
  const st::testing::CliResult r =
      st::testing::run_shardtrain(kTiny + "--model.n_embd=65536 --ckpt.async=false --ckpt.dir=" + tmp.file("new/ckpt"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "host memory: this config needs 3304.79 GiB per rank (sharded state 3072.43 GiB, gather buffers "
                       "192.10 GiB, activations 40.02 GiB, workspace 0.25 GiB; total 3304.79 GiB), but "))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "no change in `shardtrain plan`'s search fits it; lower train.micro_batch, set "
                       "train.recompute=true, or use more ranks"))
      << r.output;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("new"))) << "the refused run left its ckpt.dir behind";
}

TEST(MemoryPlanFaults, ARefusalNamesTheSmallestChangeThatFits) {
  // n_embd 1024 plans 1.70 GiB a rank; a 1 GiB cap (below any test machine's free memory) refuses it. `shardtrain
  // plan` finds the same change.
  const std::string flags = "--model.n_embd=1024 --ckpt.async=false --ckpt.dir= --dist.max_host_mem_gib=1";
  const st::testing::CliResult r = st::testing::run_shardtrain(kTiny + flags);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "but dist.max_host_mem_gib caps each rank at 1.00 GiB; it fits with --train.micro_batch=4 "
                       "--world 2 (`shardtrain plan` prints that plan)"))
      << r.output;
  const st::testing::CliResult plan = st::testing::run_shardtrain(
      "plan --config " SHARDTRAIN_SOURCE_DIR "/configs/tiny.ini --train.device=cpu " + flags);
  EXPECT_EQ(plan.code, 3) << plan.output;
  EXPECT_TRUE(contains(plan.output, "the smallest change that fits: --train.micro_batch=4 --world 2")) << plan.output;
}

TEST(MemoryPlanFaults, AnAddressSpaceLimitIsNamed) {
  // n_embd 1024 plans 1.70 GiB; ulimit -v 1572864 KiB (1.50 GiB) leaves less than that once the binary's libraries
  // are mapped. The limit must still hold those libraries (a CUDA build maps about 0.9 GiB of them) and OpenBLAS's
  // 128 MiB start-up buffer: OpenBLAS retries a failed allocation of that buffer forever, before main. One OpenBLAS
  // thread, since on a many-core machine its thread pool's stacks alone would take that address space.
  const st::testing::CliResult r = st::testing::run_shardtrain(
      kTiny + "--model.n_embd=1024", "ulimit -v 1572864 && OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 exec");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "host memory: this config needs 1.70 GiB per rank (sharded state 0.76 GiB, gather "
                       "buffers 0.05 GiB, activations 0.64 GiB, workspace 0.25 GiB; total 1.70 GiB), but "
                       "the address-space limit (RLIMIT_AS, ulimit -v) of 1.50 GiB leaves "))
      << r.output;
}

// A Hugging Face llama directory of 2048 channels, 8 layers, SwiGLU 8192 and 32,000 tokens (602,441,728 parameters:
// 2.24 GiB in fp32) whose model.safetensors is sparse: a valid header and data that reads as zeros, 1.2 GB long and
// taking no disk.
std::string sparse_llama_dir(const st::testing::TempDir& tmp) {
  const int64_t C = 2048, F = 8192, V = 32000, L = 8;
  const std::string dir = tmp.file("llama");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json")
      << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000, "hidden_size": 2048, )"
      << R"("intermediate_size": 8192, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16, )"
      << R"("max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true, )"
      << R"("hidden_act": "silu", "torch_dtype": "bfloat16"})";
  std::vector<SafetensorsTensor> tensors = {{"model.embed_tokens.weight", {V, C}, SafetensorsDtype::kBF16}};
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* n : {"input_layernorm", "post_attention_layernorm"})
      tensors.push_back({p + n + ".weight", {C}, SafetensorsDtype::kBF16});
    for (const char* n : {"q_proj", "k_proj", "v_proj", "o_proj"})
      tensors.push_back({p + "self_attn." + n + ".weight", {C, C}, SafetensorsDtype::kBF16});
    tensors.push_back({p + "mlp.gate_proj.weight", {F, C}, SafetensorsDtype::kBF16});
    tensors.push_back({p + "mlp.up_proj.weight", {F, C}, SafetensorsDtype::kBF16});
    tensors.push_back({p + "mlp.down_proj.weight", {C, F}, SafetensorsDtype::kBF16});
  }
  tensors.push_back({"model.norm.weight", {C}, SafetensorsDtype::kBF16});
  const std::string header = safetensors_header(tensors);
  int64_t bytes = 8 + static_cast<int64_t>(header.size());
  for (const SafetensorsTensor& t : tensors) bytes += safetensors_bytes(t);
  const std::string file = dir + "/model.safetensors";
  {
    std::ofstream out(file, std::ios::binary);
    const uint64_t n = header.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header;
  }
  EXPECT_EQ(::truncate(file.c_str(), bytes), 0);
  return dir;
}

// generate plans the host's memory before it reads a weight: a CPU decoder of 2.24 GiB of fp32 weights under a 1.50
// GiB address-space limit is refused with its breakdown and the limit (exit 2), not ended by a failed allocation.
TEST(MemoryPlanFaults, GenerateIsRefusedBeforeItReadsAWeight) {
  st::testing::TempDir tmp;
  const std::string dir = sparse_llama_dir(tmp);
  const st::testing::CliResult r = st::testing::run_shardtrain(
      "generate --init.from " + dir + " --prompt-ids 1,2,3 --max-tokens 2 --train.device=cpu --model.seq_len=256",
      "ulimit -v 1572864 && OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 exec");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "host memory: generate on cpu with 1 sequence(s) of 256 positions needs 2.81 GiB (decoder 2.31 "
                       "GiB (weights 2.24 GiB, "))
      << r.output;
  EXPECT_TRUE(contains(r.output, "but the address-space limit (RLIMIT_AS, ulimit -v) of 1.50 GiB leaves ")) << r.output;
  // Without the limit the same directory decodes (zeros: every logit ties, and the argmax takes token 0).
  const st::testing::CliResult ok =
      st::testing::run_shardtrain("generate --init.from " + dir +
                                      " --prompt-ids 1,2,3 --max-tokens 2 --temperature 0 "
                                      "--train.device=cpu --model.seq_len=256",
                                  "OPENBLAS_NUM_THREADS=1 exec");
  EXPECT_EQ(ok.code, 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, "0,0\n")) << ok.output;
}

}  // namespace
}  // namespace st
