// The fixture of the checkpoint tests that train testing::tiny_config() on fake ranks: 8 steps, 2 warm-up steps,
// ckpt.dir in a fresh temporary directory, every checkpoint kept, one OpenMP thread, and SHARDTRAIN_FAULT cleared
// after each test (a test that injects a fault sets it).
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdlib>

#include "../common/temp_dir.h"
#include "../common/tiny_training.h"
#include "shardtrain/core/config.h"

namespace st::testing {

class TinyCkptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    omp_set_num_threads(1);
    cfg_ = tiny_config();
    cfg_.train.steps = 8;
    cfg_.optim.warmup_steps = 2;
    cfg_.ckpt.dir = tmp_.file("ckpt");
    cfg_.ckpt.keep = 0;
  }
  void TearDown() override { unsetenv("SHARDTRAIN_FAULT"); }
  TempDir tmp_;
  Config cfg_;
};

}  // namespace st::testing
