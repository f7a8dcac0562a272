// The two kernel scratch sizes the memory plan cannot compute (scratch_sizes.h) against what the libraries ask for on
// this GPU, at every shipped config's shape (configs/*.ini) on cuda, at its micro-batch and at 1: CUB's radix sort in
// embedding_backward within cub_sort_pairs_temp_bound, and cuDNN's fused attention (both backward modes) within
// attention_scratch_bound, the figure `shardtrain plan` and start-up plan with.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "../common/gpu_test.h"
#include "shardtrain/core/config.h"
#include "shardtrain/kernels/gpu/attention_choice.h"
#include "shardtrain/kernels/gpu/embedding.h"
#include "shardtrain/kernels/scratch_sizes.h"
#include "shardtrain/shard/run_plan.h"

namespace st {
namespace {

std::vector<Config> shipped_on_cuda() {
  std::vector<Config> out;
  for (const auto& e : std::filesystem::directory_iterator(std::string(SHARDTRAIN_SOURCE_DIR) + "/configs")) {
    if (e.path().extension() != ".ini") continue;
    Config c = load_config(e.path().string(), {"--train.device=cuda", "--train.dtype=bf16"});
    for (const int64_t micro : {c.train.micro_batch, int64_t{1}}) {
      c.train.micro_batch = micro;
      c.source = e.path().filename().string();
      out.push_back(c);
    }
  }
  return out;
}

TEST(ScratchBounds, CubSortWithinItsBoundAtShippedShapes) {
  ST_SKIP_WITHOUT_GPU();
  int checked = 0;
  for (const Config& c : shipped_on_cuda()) {
    const int64_t BT = c.train.micro_batch * c.model.seq_len;
    EXPECT_LE(gpu::embedding_sort_temp_bytes(BT), gpu::cub_sort_pairs_temp_bound(BT)) << c.source << ", B*T " << BT;
    ++checked;
  }
  EXPECT_GE(checked, 30);
}

TEST(ScratchBounds, CudnnAttentionWithinItsBoundAtShippedShapes) {
  ST_SKIP_WITHOUT_GPU();
  gpu::Cudnn cudnn;
  int on_cudnn = 0;
  for (Config c : shipped_on_cuda()) {
    for (const bool deterministic : {true, false}) {
      c.train.deterministic = deterministic;
      const ModelConfig& m = c.model;
      const gpu::AttentionChoice a =
          gpu::choose_attention<bf16>({c.train.attention, deterministic, static_cast<int>(c.train.micro_batch),
                                       m.seq_len, m.n_embd, m.n_head, m.kv_heads(), m.head_dim()},
                                      cudnn);
      EXPECT_LE(a.scratch_bytes, attention_scratch_bound(c)) << c.source << ", micro-batch " << c.train.micro_batch
                                                             << ", deterministic " << deterministic << ": " << a.what;
      on_cudnn += a.cudnn;
    }
  }
  EXPECT_GT(on_cudnn, 0);  // cuDNN ran some of the shapes: the bound was checked against its figures
}

}  // namespace
}  // namespace st
