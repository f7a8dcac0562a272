// What the CUDA engine takes from the device, against its memory plan. cudaMemGetInfo counts the whole device, so this
// binary's tests run alone (RUN_SERIAL: no other test process allocates or frees device memory while they measure).
#include <gtest/gtest.h>

#include <cstdint>

#include "../common/gpu_test.h"
#include "../common/tiny_training.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/shard/run_plan.h"
#include "shardtrain/train/step_engine.h"
#include "small_cuda_config.h"

namespace st {
namespace {

// Step `step`'s micro-batches on one rank.
BatchFn batches(const Config& c, int64_t step) { return testing::corpus_batches(c, 77, step); }

// peak_memory_bytes() is the most device memory seen in use: at least what the plan allocated (all of it is
// allocated at set-up), no more than the device has, and never lower after more steps.
// The device memory in use covers the plan's buffers, and the plan start-up checked (run_plan.h: what `shardtrain plan`
// prints) covers what the rank allocates: the model's activations are exactly the host footprint's, and the memory
// the engine added, before and after two steps, is within the planned total (its runtime reserve included).
TEST(CudaShardedModel, PeakMemoryCoversThePlanAndNeverDecreases) {
  ST_SKIP_WITHOUT_GPU();
  const Config c = testing::small_config(Device::kCuda, DType::kBF16);
  size_t free_b = 0, total_b = 0;
  ST_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const int64_t before = static_cast<int64_t>(total_b - free_b);
  SoloCommunicator comm;
  StepEngine e(c, comm);
  const MemoryStats mem = e.sharded().memory();
  const int64_t at_start = e.sharded().peak_memory_bytes();
  EXPECT_GE(at_start, mem.sharded_state_bytes + mem.gather_buffer_bytes + mem.activation_bytes);
  EXPECT_LE(at_start, static_cast<int64_t>(total_b));
  const MemoryPlan planned = planned_cuda_device(c, 1, false);
  EXPECT_EQ(mem.activation_bytes, planned.activations);
  EXPECT_LE(mem.sharded_state_bytes + mem.gather_buffer_bytes + mem.activation_bytes + mem.workspace_bytes,
            planned.total());
  EXPECT_LE(at_start - before, planned.total()) << "planned " << planned.breakdown();
  for (int64_t s = 0; s < 2; ++s) e.optimizer_step(s, e.forward_backward(batches(c, s), 2));
  EXPECT_GE(e.sharded().peak_memory_bytes(), at_start);
  EXPECT_LE(e.sharded().peak_memory_bytes() - before, planned.total()) << "planned " << planned.breakdown();
}

}  // namespace
}  // namespace st
