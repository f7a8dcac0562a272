// QLoRA on the CUDA backend against the CPU reference, on one GPU: the NF4 base quantised on the device holds the
// CPU's bytes (its dequantised weights are the CPU's bit for bit), the gathers dequantise it on the communication
// stream, and the adapters train as on the CPU (fp32: 1e-4 relative on the losses, norms and final adapters; bf16:
// 2e-2 on the losses). A base written through the host view (init.from's path) is quantised as the CPU quantises it,
// and a checkpoint of a QLoRA run written on the GPU loads on the CPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "../common/gpu_test.h"
#include "../common/temp_dir.h"
#include "../common/tiny_training.h"
#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/train/step_engine.h"
#include "lora_checkpoint_check.h"
#include "small_cuda_config.h"

namespace st {
namespace {

using testing::rel_norm_error;
using testing::Trace;

constexpr uint64_t kSeed = 77;

// gpt2 (the small odd-sized model); llama with grouped-query attention, q/k/v biases, an untied head and dropout.
std::vector<Config> configs(Device device, DType dtype) {
  Config gpt2 = testing::small_config(device, dtype);
  gpt2.model.lora.rank = 3;
  gpt2.model.lora.alpha = 5;
  gpt2.model.lora.targets = "qkv,fc";
  gpt2.model.lora.base_dtype = LoraBase::kNf4;
  Config llama = gpt2;
  llama.model.arch = ModelArch::kLlama;
  llama.model.n_head = 4;
  llama.model.n_kv_head = 2;
  llama.model.ffn_dim = 80;
  llama.model.qkv_bias = true;
  llama.model.tie_embeddings = false;
  llama.model.lora.targets = "q,v,up,down";
  llama.model.lora.dropout = 0.1f;
  return {gpt2, llama};
}

Trace train(const Config& c, int64_t steps) {
  SoloCommunicator comm;
  return testing::train(c, comm, kSeed, steps);
}

TEST(QloraCuda, HoldsTheCpusBaseAndTrainsAsTheCpuDoes) {
  ST_SKIP_WITHOUT_GPU();
  const std::vector<Config> cpu_cfgs = configs(Device::kCpu, DType::kF32);
  const std::vector<Config> gpu_cfgs = configs(Device::kCuda, DType::kF32);
  const std::vector<Config> half_cfgs = configs(Device::kCuda, DType::kBF16);
  for (size_t k = 0; k < cpu_cfgs.size(); ++k) {
    SCOPED_TRACE(to_string(cpu_cfgs[k].model.arch));
    const Trace cpu = train(cpu_cfgs[k], 5), gpu = train(gpu_cfgs[k], 5), half = train(half_cfgs[k], 5);
    ASSERT_EQ(gpu.losses.size(), cpu.losses.size());
    for (size_t i = 0; i < cpu.losses.size(); ++i) {
      EXPECT_NEAR(gpu.losses[i], cpu.losses[i], 1e-4 * cpu.losses[i]) << "step " << i;
      EXPECT_NEAR(gpu.norms[i], cpu.norms[i], 1e-4 * cpu.norms[i]) << "step " << i;
      EXPECT_NEAR(half.losses[i], cpu.losses[i], 2e-2 * cpu.losses[i]) << "bf16 step " << i;
    }
    for (const UnitLayout& u : build_units(cpu_cfgs[k].model)) {
      for (const Trace* t : {&gpu, &half}) {
        const std::vector<float>& g = t->params[static_cast<size_t>(u.index)];
        const std::vector<float>& c = cpu.params[static_cast<size_t>(u.index)];
        ASSERT_EQ(g.size(), c.size()) << u.name;
        if (u.numel > 0)
          EXPECT_LE(rel_norm_error({g.begin(), g.begin() + u.numel}, {c.begin(), c.begin() + u.numel}),
                    t == &gpu ? 1e-4 : 5e-2)
              << u.name;
        // An NF4 block's base is the storage dequantised: the CPU's bits (the embedding and head: the seed's values
        // in T, exact in fp32 only).
        if (u.nf4_base || t == &gpu)
          EXPECT_TRUE(std::equal(g.begin() + u.numel, g.end(), c.begin() + u.numel)) << u.name << "'s base differs";
      }
    }
  }
}

// Weights written into the host view of every unit (as init.from writes them) are quantised on the device into the
// bytes the CPU backend makes of them; a checkpoint of the run loads on the CPU with the same adapters.
TEST(QloraCuda, AWrittenBaseAndCheckpointsMatchTheCpu) {
  ST_SKIP_WITHOUT_GPU();
  for (Config c : configs(Device::kCuda, DType::kBF16)) {
    SCOPED_TRACE(to_string(c.model.arch));
    testing::TempDir dir;
    c.ckpt.dir = dir.str();
    Config cpu_cfg = c;
    cpu_cfg.train.device = Device::kCpu;
    cpu_cfg.train.dtype = DType::kF32;
    SoloCommunicator comm;
    StepEngine gpu(c, comm), cpu(cpu_cfg, comm);
    for (StepEngine* e : {&gpu, &cpu}) {
      for (const UnitLayout& u : e->units()) {
        if (u.frozen_numel == 0) continue;
        e->sharded().pull_unit(u.index);
        std::vector<float>& view = e->sharded().shard(u.index).frozen;
        const ShardSpan span = e->sharded().shard(u.index).frozen_span;
        for (int64_t i = 0; i < span.count; ++i)
          view[static_cast<size_t>(i)] = 0.001f * static_cast<float>((span.offset + i) * 7919 % 401) - 0.2f;
        e->sharded().push_unit(u.index);
      }
    }
    for (const UnitLayout& u : gpu.units())
      if (u.nf4_base) EXPECT_EQ(gpu.sharded().gather_frozen(u.index), cpu.sharded().gather_frozen(u.index)) << u.name;
    for (int64_t s = 0; s < 2; ++s) gpu.train_step(testing::corpus_batches(c, kSeed, s), 2, s);
    testing::expect_adapters_load_on_the_cpu(c, gpu, 2, comm);
  }
}

}  // namespace
}  // namespace st
