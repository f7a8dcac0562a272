// A config the host cannot hold: the CPU backend plans its memory before it allocates (shard/memory_plan.h) and
// refuses at start-up with the plan's breakdown and the limit that binds (exit 2), instead of allocating and
// initialising until std::bad_alloc ends the run as an internal error.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"

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
                       "host memory: this config needs 3688.89 GiB per rank (sharded state 3072.43 GiB, gather buffers "
                       "576.20 GiB, activations 40.02 GiB, workspace 0.25 GiB; total 3688.89 GiB), but "))
      << r.output;
  EXPECT_TRUE(contains(r.output, "lower train.micro_batch, set train.recompute=true, or use more ranks")) << r.output;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("new"))) << "the refused run left its ckpt.dir behind";
}

TEST(MemoryPlanFaults, AnAddressSpaceLimitIsNamed) {
  // n_embd 1024 plans 1.79 GiB; ulimit -v 1572864 KiB (1.50 GiB) leaves less than that once the binary's libraries
  // are mapped. The limit must still hold those libraries (a CUDA build maps about 0.9 GiB of them) and OpenBLAS's
  // 128 MiB start-up buffer: OpenBLAS retries a failed allocation of that buffer forever, before main. One OpenBLAS
  // thread, since on a many-core machine its thread pool's stacks alone would take that address space.
  const st::testing::CliResult r = st::testing::run_shardtrain(
      kTiny + "--model.n_embd=1024", "ulimit -v 1572864 && OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 exec");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "host memory: this config needs 1.79 GiB per rank (sharded state 0.76 GiB, gather "
                       "buffers 0.14 GiB, activations 0.64 GiB, workspace 0.25 GiB; total 1.79 GiB), but "
                       "the address-space limit (RLIMIT_AS, ulimit -v) of 1.50 GiB leaves "))
      << r.output;
}

}  // namespace
}  // namespace st
