// LoRA on the CUDA backend against the CPU reference, on one GPU: the frozen base is gathered from its own shard
// beside the adapters', the wholly frozen embedding and head are never reduced, and the adapters train as on the CPU
// (fp32: 1e-4 relative on the losses, the first step's adapter gradients and the final adapters; bf16: 2e-2 on the
// losses). The base stays bit-identical, the step gated on the device gives the host path's bits, and a LoRA
// checkpoint written on the GPU loads on the CPU.
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

Config lora(Config c, const char* targets) {
  c.model.lora.rank = 3;
  c.model.lora.alpha = 5;
  c.model.lora.targets = targets;
  return c;
}

// gpt2 (the small odd-sized model) on two of its layers; llama with grouped-query attention, q/k/v biases and an
// untied head on four, with adapter dropout.
std::vector<Config> configs(Device device, DType dtype) {
  Config llama = testing::small_config(device, dtype);
  llama.model.arch = ModelArch::kLlama;
  llama.model.n_head = 4;
  llama.model.n_kv_head = 2;
  llama.model.ffn_dim = 80;
  llama.model.qkv_bias = true;
  llama.model.tie_embeddings = false;
  Config dropped = lora(llama, "q,v,o,down");
  dropped.model.lora.dropout = 0.1f;  // the GPU draws the CPU's masks
  return {lora(testing::small_config(device, dtype), "qkv,fc_proj"), dropped};
}

Trace train(const Config& c, int64_t steps) {
  SoloCommunicator comm;
  return testing::train(c, comm, kSeed, steps, /*record_grads=*/true);
}

TEST(LoraCuda, TrainsTheAdaptersAsTheCpuDoes) {
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
    const std::vector<UnitLayout> units = build_units(cpu_cfgs[k].model);
    // Training moved the adapters: every B started at zero and is not zero now.
    for (const TensorSpec& t : units[1].tensors) {
      if (t.frozen || t.name.back() != 'B') continue;
      const std::vector<float>& p = gpu.params[1];
      EXPECT_TRUE(std::any_of(p.begin() + t.offset, p.begin() + t.offset + t.numel, [](float v) { return v != 0.0f; }))
          << t.name << " stayed zero";
    }
    for (const UnitLayout& u : units) {
      // The gradients are the adapters' (empty for the embedding and the head); the parameters every tensor's.
      ASSERT_EQ(gpu.grads0[static_cast<size_t>(u.index)].size(), static_cast<size_t>(u.numel)) << u.name;
      if (u.numel > 0)
        EXPECT_LE(rel_norm_error(gpu.grads0[static_cast<size_t>(u.index)], cpu.grads0[static_cast<size_t>(u.index)]),
                  1e-4)
            << u.name;
      const std::vector<float>& g = gpu.params[static_cast<size_t>(u.index)];
      const std::vector<float>& c = cpu.params[static_cast<size_t>(u.index)];
      ASSERT_EQ(g.size(), static_cast<size_t>(u.numel + u.frozen_numel)) << u.name;
      const std::vector<float> g_adapters(g.begin(), g.begin() + u.numel), c_adapters(c.begin(), c.begin() + u.numel);
      if (u.numel > 0) EXPECT_LE(rel_norm_error(g_adapters, c_adapters), 1e-4) << u.name;
      // The frozen base: the seed's values on both backends, never updated (fp32: the same bits).
      EXPECT_TRUE(std::equal(g.begin() + u.numel, g.end(), c.begin() + u.numel)) << u.name << "'s base moved";
    }
  }
}

// The step decided on the device (train_step) gives the host path's bits with frozen units among the norm's parts;
// a checkpoint of it loads on the CPU with the same adapters.
TEST(LoraCuda, GatedStepsAndCheckpointsMatchTheHostPathAndTheCpu) {
  ST_SKIP_WITHOUT_GPU();
  for (Config c : configs(Device::kCuda, DType::kBF16)) {
    SCOPED_TRACE(to_string(c.model.arch));
    testing::TempDir dir;
    c.ckpt.dir = dir.str();
    SoloCommunicator comm;
    StepEngine gated(c, comm), host(c, comm);
    ASSERT_TRUE(gated.sharded().gates_on_device());
    for (int64_t s = 0; s < 3; ++s) {
      const BatchFn b = testing::corpus_batches(c, kSeed, s);
      const StepStats a = gated.train_step(b, 2, s);
      const StepStats h = host.optimizer_step(s, host.forward_backward(b, 2, s));
      EXPECT_EQ(a.loss, h.loss) << "step " << s;
      EXPECT_EQ(a.grad_norm, h.grad_norm) << "step " << s;
    }
    EXPECT_EQ(gated.gather_params(), host.gather_params());
    testing::expect_adapters_load_on_the_cpu(c, gated, 3, comm);
  }
}

// Optimizer offload on one GPU, with a base written through the host view as init.from writes it (an offloaded unit's
// view is its host state): the host AdamW trains the adapters the device AdamW trains, bit for bit, for LoRA and QLoRA
// bases, whichever units it holds and whether it speculates; a checkpoint of the offloaded run loads into a run
// without offload with the same parameters.
TEST(LoraCuda, OffloadTrainsWhatTheDeviceOptimizerTrains) {
  ST_SKIP_WITHOUT_GPU();
  struct Case {
    OffloadMode mode;
    float fraction;
    Speculation speculation;
  };
  const auto write_base = [](StepEngine& e) {
    for (const UnitLayout& u : e.units()) {
      if (u.frozen_numel == 0) continue;
      e.sharded().pull_unit(u.index);
      UnitShard& view = e.sharded().shard(u.index);
      ASSERT_EQ(view.frozen.size(), static_cast<size_t>(u.nf4_base ? u.frozen_numel : view.frozen_slot)) << u.name;
      for (int64_t i = 0; i < view.frozen_span.count; ++i)
        view.frozen[static_cast<size_t>(i)] = 0.001f * static_cast<float>((view.frozen_span.offset + i) * 7919 % 401) -
                                              0.2f;
      e.sharded().push_unit(u.index);
    }
  };
  const auto run = [&](const Config& c, std::vector<std::vector<float>>* params, const std::string& save_to) {
    SoloCommunicator comm;
    StepEngine e(c, comm);
    write_base(e);
    std::vector<float> losses;
    for (int64_t s = 0; s < 4; ++s) losses.push_back(e.train_step(testing::corpus_batches(c, kSeed, s), 2, s).loss);
    *params = e.gather_params();
    if (!save_to.empty()) {
      Config saving = c;
      saving.ckpt.dir = save_to;
      CheckpointState cs;
      cs.step = 4;
      cs.optimizer_updates = e.updates();
      Config plain = c;
      plain.optim.offload = OffloadMode::kNone;
      const std::string where = save_checkpoint(saving, e.sharded(), cs, comm);
      StepEngine back(plain, comm);
      load_checkpoint(where, plain, back.sharded(), comm);
      write_base(back);  // the checkpoint names its base (here written, not read from init.from)
      EXPECT_EQ(back.gather_params(), *params) << "loaded without offload";
    }
    return losses;
  };
  std::vector<Config> cfgs = configs(Device::kCuda, DType::kBF16);
  Config qlora = cfgs[1];
  qlora.model.lora.base_dtype = LoraBase::kNf4;
  cfgs.push_back(qlora);
  for (Config base : cfgs) {
    base.optim.grad_clip = 0.05f;  // clipped steps: the first speculates and redoes, the others do not speculate
    base.optim.offload_threads = 2;
    SCOPED_TRACE(::testing::Message() << to_string(base.model.arch) << " " << to_string(base.model.lora.base_dtype));
    std::vector<std::vector<float>> want_params;
    const std::vector<float> want = run(base, &want_params, "");
    for (const Case& k : {Case{OffloadMode::kOptimizer, 1.0f, Speculation::kOff},
                          Case{OffloadMode::kOptimizerParams, 1.0f, Speculation::kOff},
                          Case{OffloadMode::kOptimizer, 1.0f, Speculation::kOn},
                          Case{OffloadMode::kOptimizerParams, 0.5f, Speculation::kOn}}) {
      Config c = base;
      c.optim.offload = k.mode;
      c.optim.offload_fraction = k.fraction;
      c.optim.offload_speculative = k.speculation;
      SCOPED_TRACE(::testing::Message() << "optim.offload=" << to_string(k.mode) << ", fraction " << k.fraction
                                        << ", speculation " << (k.speculation == Speculation::kOn));
      testing::TempDir dir;
      std::vector<std::vector<float>> params;
      EXPECT_EQ(run(c, &params, dir.str()), want);
      EXPECT_EQ(params, want_params);
    }
  }
}

}  // namespace
}  // namespace st
