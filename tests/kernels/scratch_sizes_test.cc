// The kernels' scratch sizes as host arithmetic (scratch_sizes.h): chunk counts and bytes for shapes worked out by
// hand, and the documented bounds for CUB's sort and cuDNN's attention.
#include "shardtrain/kernels/scratch_sizes.h"

#include <gtest/gtest.h>

namespace st::gpu {
namespace {

TEST(ScratchSizes, NormalisationChunksByHand) {
  // About 512 chunks of at least 8 rows; LayerNorm rounds the rows up to a multiple of 4.
  EXPECT_EQ(rmsnorm_backward_chunks(4096), 512);
  EXPECT_EQ(rmsnorm_backward_chunk_rows(5000), 10);
  EXPECT_EQ(rmsnorm_backward_chunks(5000), 500);
  EXPECT_EQ(rmsnorm_backward_chunks(100), 13);  // 8-row chunks
  EXPECT_EQ(layernorm_backward_chunk_rows(5000), 12);
  EXPECT_EQ(layernorm_backward_chunks(5000), 417);
  EXPECT_EQ(rmsnorm_backward_scratch_bytes(5000, 768), size_t{500} * 768 * 4);
  EXPECT_EQ(layernorm_backward_scratch_bytes(5000, 768), size_t{2} * 417 * 768 * 4);
  EXPECT_EQ(rmsnorm_backward_scratch_bytes(0, 768), 0u);
}

TEST(ScratchSizes, MatmulBiasChunksByHand) {
  // At most 128 chunks of at least 64 rows.
  EXPECT_EQ(matmul_bias_chunks(5000), 79);
  EXPECT_EQ(matmul_bias_chunks(16384), 128);
  EXPECT_EQ(matmul_backward_scratch_bytes(16384, 3072), size_t{128} * 3072 * 4);
}

TEST(ScratchSizes, FixedAndAlignedSizes) {
  EXPECT_EQ(reduce_scratch_bytes(), 512u * 8);
  EXPECT_EQ(column_sums_reserved_bytes(1), 256u);
  EXPECT_EQ(column_sums_reserved_bytes(64), 256u);
  EXPECT_EQ(column_sums_reserved_bytes(65), 512u);
  EXPECT_EQ(flash_attention_backward_scratch_bytes(1, 100, 3, 3, 64), 1280u);  // 1,200 bytes, aligned
  EXPECT_EQ(flash_attention_backward_scratch_bytes(2, 64, 768, 12),
            flash_attention_backward_scratch_bytes(2, 64, 12, 12, 64));
}

TEST(ScratchSizes, CubAndCudnnBoundsByHand) {
  // 16,384 items: 2 x 65,536 + (65,536 + 1,024) + 1 MiB.
  EXPECT_EQ(cub_sort_pairs_temp_bound(16384), size_t{131072} + 66560 + 1048576);
  EXPECT_EQ(embedding_backward_scratch_bytes(16, 1024, 768), 3 * size_t{65536} + cub_sort_pairs_temp_bound(16384));
  EXPECT_EQ(embedding_sort_temp_offset(16, 1024), 3 * size_t{65536});
  // Llama 3.1 8B at B = 1, T = 2048: 65,536 rows of 32 heads; dS 256 MiB, the dQ accumulators 32 MiB each.
  constexpr size_t rows = 65536, dq = rows * 128 * 4;
  EXPECT_EQ(cudnn_attention_scratch_bound(1, 2048, 32, 8, 128), rows * 2048 * 2 + dq + (16u << 20) + rows * 4 + dq);
  // T = 100 pads to 128 rows in cuDNN's workspace: 128^2 x 2 + 128 x 64 x 4 bytes a head, then 100 x 4 and
  // 100 x 64 x 4 of ours (2 heads).
  EXPECT_EQ(cudnn_attention_scratch_bound(1, 100, 2, 2, 64),
            2 * (128 * 128 * 2 + 128 * 64 * 4) + (16u << 20) + 1024 + 2 * 100 * 64 * 4);
}

}  // namespace
}  // namespace st::gpu
