#include "shardtrain/kernels/scratch_sizes.h"

#include <algorithm>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/nf4.h"

namespace st::gpu {
namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// About 512 chunks for the normalisations: with a thread per chunk and column pack, enough to fill an H200 at any
// width, while the partials (chunks * C floats) stay small beside the rows (docs/performance.md, "Kernels").
constexpr int64_t kNormTargetChunks = 512;
constexpr int64_t kNormMinChunkRows = 8;
// matmul's bias gradient: at most 128 chunks of at least 64 rows.
constexpr int64_t kBiasMaxChunks = 128;
constexpr int64_t kBiasMinChunkRows = 64;

int64_t chunks_of(int64_t N, int64_t rows) { return (N + rows - 1) / rows; }

}  // namespace

size_t reduce_scratch_bytes() { return kReduceBlocks * sizeof(double); }

int64_t rmsnorm_backward_chunk_rows(int64_t N) {
  return std::max(kNormMinChunkRows, (N + kNormTargetChunks - 1) / kNormTargetChunks);
}
int64_t rmsnorm_backward_chunks(int64_t N) { return chunks_of(N, rmsnorm_backward_chunk_rows(N)); }

int64_t layernorm_backward_chunk_rows(int64_t N) {
  const int64_t rows = std::max(kNormMinChunkRows, (N + kNormTargetChunks - 1) / kNormTargetChunks);
  return (rows + kLayernormFusedWarps - 1) / kLayernormFusedWarps * kLayernormFusedWarps;
}
int64_t layernorm_backward_chunks(int64_t N) { return chunks_of(N, layernorm_backward_chunk_rows(N)); }

int64_t matmul_bias_chunk_rows(int64_t N) {
  return std::max(kBiasMinChunkRows, (N + kBiasMaxChunks - 1) / kBiasMaxChunks);
}
int64_t matmul_bias_chunks(int64_t N) { return chunks_of(N, matmul_bias_chunk_rows(N)); }

size_t rmsnorm_backward_scratch_bytes(int64_t N, int C) {
  return N <= 0 || C <= 0 ? 0 : static_cast<size_t>(rmsnorm_backward_chunks(N)) * C * sizeof(float);
}

size_t layernorm_backward_scratch_bytes(int64_t N, int C) {
  return N <= 0 || C <= 0 ? 0 : 2 * static_cast<size_t>(layernorm_backward_chunks(N)) * C * sizeof(float);
}

size_t matmul_backward_scratch_bytes(int64_t N, int OC) {
  return static_cast<size_t>(matmul_bias_chunks(N)) * static_cast<size_t>(OC) * sizeof(float);
}

size_t column_sums_reserved_bytes(int64_t floats) {
  return align_up(static_cast<size_t>(std::max<int64_t>(floats, 0)) * sizeof(float));
}

size_t flash_attention_backward_scratch_bytes(int B, int T_, int NH, int /*NKV*/, int /*hs*/) {
  return align_up(static_cast<size_t>(B) * NH * T_ * sizeof(float));
}

size_t flash_attention_backward_scratch_bytes(int B, int T_, int /*C*/, int NH) {
  return flash_attention_backward_scratch_bytes(B, T_, NH, NH, 0);
}

size_t cub_sort_pairs_temp_bound(int64_t n) {
  if (n <= 0) return 0;
  const size_t items = static_cast<size_t>(n) * sizeof(int32_t);
  return 2 * align_up(items) + align_up(items + 1024) + (size_t{1} << 20);
}

size_t embedding_sort_temp_offset(int B, int T_) {
  return 3 * align_up(static_cast<size_t>(std::max<int64_t>(int64_t{B} * T_, 0)) * sizeof(int32_t));
}

size_t embedding_backward_scratch_bytes(int B, int T_, int /*C*/) {
  const int64_t BT = static_cast<int64_t>(B) * T_;
  if (BT <= 0) return 0;
  ST_CHECK(BT < (int64_t{1} << 31), "embedding_backward: B*T = ", BT, " does not fit in int");
  return embedding_sort_temp_offset(B, T_) + cub_sort_pairs_temp_bound(BT);
}

size_t cudnn_attention_scratch_bound(int B, int T_, int NH, int /*NKV*/, int hs) {
  // cuDNN pads the sequence to its 128-row tiles in the workspace (the deterministic backward's dS is
  // B x NH x Tp x Tp in 16 bits); our own row sums and dQ accumulator follow at T.
  const size_t heads = static_cast<size_t>(B) * NH, Tp = (static_cast<size_t>(T_) + 127) / 128 * 128;
  const size_t workspace = heads * Tp * Tp * 2 + heads * Tp * hs * sizeof(float) + (size_t{16} << 20);
  const size_t rows = heads * T_;
  return align_up(workspace) + align_up(rows * sizeof(float)) +
         align_up(rows * static_cast<size_t>(hs) * sizeof(float));
}

size_t nf4_quantize_scratch_bytes(int64_t n) {
  const int64_t weights = std::max<int64_t>(n, 0);
  return sizeof(uint64_t) + static_cast<size_t>(nf4_groups(weights)) * sizeof(double) +
         static_cast<size_t>(nf4_blocks(weights)) * sizeof(float);
}

size_t fp8_quantize_scratch_bytes(int64_t groups) {
  return sizeof(uint64_t) + 2 * static_cast<size_t>(std::max<int64_t>(groups, 0)) * sizeof(float);
}

size_t decode_attention_at_scratch_bytes(int rows, int NH, int hs, int max_len) {
  if (rows > kDecodeSplitMaxRows) return 0;
  const int64_t splits = (int64_t{max_len} + kDecodeSplitKeys - 1) / kDecodeSplitKeys;
  return sizeof(float) * static_cast<size_t>(int64_t{rows} * NH * splits * (hs + 2));
}

int sample_chunks(int V) { return (V + kSampleChunk - 1) / kSampleChunk; }

size_t sample_rows_scratch_bytes(int rows, int V) {
  return static_cast<size_t>(rows) * (16 * static_cast<size_t>(sample_chunks(V)) + 8);
}

int argmax_chunks(int V) { return (V + kArgmaxChunk - 1) / kArgmaxChunk; }

size_t argmax_rows_scratch_bytes(int rows, int V) {
  return static_cast<size_t>(rows) * 12 * static_cast<size_t>(argmax_chunks(V));
}

size_t decode_step_scratch_bytes(int max_batch, int NH, int hs, int max_len, int V) {
  return std::max({decode_attention_at_scratch_bytes(kDecodeSplitMaxRows, NH, hs, max_len),
                   sample_rows_scratch_bytes(max_batch, V), argmax_rows_scratch_bytes(max_batch, V)});
}

}  // namespace st::gpu
