// A LoRA run's checkpoint written on the GPU loads on the CPU with the same adapters, bit for bit (the shared check of
// the LoRA and QLoRA GPU tests).
//
//   testing::expect_adapters_load_on_the_cpu(c, gpu_engine, /*step=*/3, comm);   // c.ckpt.dir set
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "shardtrain/ckpt/checkpoint.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/train/step_engine.h"

namespace st::testing {

inline void expect_adapters_load_on_the_cpu(const Config& c, StepEngine& gpu, int64_t step, Communicator& comm) {
  CheckpointState cs;
  cs.step = step;
  cs.optimizer_updates = gpu.updates();
  const std::string where = save_checkpoint(c, gpu.sharded(), cs, comm);
  Config cpu_cfg = c;
  cpu_cfg.train.device = Device::kCpu;
  cpu_cfg.train.dtype = DType::kF32;
  StepEngine cpu(cpu_cfg, comm);
  load_checkpoint(where, cpu_cfg, cpu.sharded(), comm);
  const std::vector<std::vector<float>> a = gpu.gather_params(), b = cpu.gather_params();
  for (const UnitLayout& u : gpu.units()) {
    const std::vector<float>& x = a[static_cast<size_t>(u.index)];
    const std::vector<float>& y = b[static_cast<size_t>(u.index)];
    EXPECT_TRUE(std::equal(x.begin(), x.begin() + u.numel, y.begin())) << u.name << ": the adapters differ";
  }
}

}  // namespace st::testing
