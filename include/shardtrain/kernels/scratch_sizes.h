// The device scratch each CUDA kernel needs, as host arithmetic: the memory plan (shard/memory_plan.h) and
// `shardtrain plan` size a run from these without a GPU, and the kernels check what they are given against the same
// functions. Sizes are in bytes and depend on the shape alone, never on the device.
//
//   const size_t need = gpu::rmsnorm_backward_scratch_bytes(B * T, C);   // GpuContext::scratch >= need
//
// Two sizes are a CUDA library's run-time query, which host code cannot make; for those the plan takes a documented
// bound, and the kernels refuse to run if the library asks for more (GPU tests check the bound at the shipped
// configs' shapes):
//   - CUB's radix sort in embedding_backward (cub_sort_pairs_temp_bound);
//   - cuDNN's fused attention workspace (cudnn_attention_scratch_bound).
#pragma once

#include <cstddef>
#include <cstdint>

namespace st::gpu {

// cuBLASLt's workspace (Blas's default): room for its split-K and stream-K algorithms.
inline constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;

// The sums of squares and plain sums (reduce.h) always run this many blocks, one double of partial sum each.
inline constexpr int kReduceBlocks = 512;
size_t reduce_scratch_bytes();

// Row chunks of the deterministic column sums: the normalisations' weight (and bias) gradients and matmul's bias
// gradient are summed per chunk of rows, then over chunks in order. A function of the row count N alone, so the
// summation tree is the same on every GPU.
int64_t rmsnorm_backward_chunk_rows(int64_t N);
int64_t rmsnorm_backward_chunks(int64_t N);
// LayerNorm's chunks hold a multiple of kLayernormFusedWarps rows: the fused backward's warps share them evenly.
inline constexpr int kLayernormFusedWarps = 4;
int64_t layernorm_backward_chunk_rows(int64_t N);
int64_t layernorm_backward_chunks(int64_t N);
int64_t matmul_bias_chunk_rows(int64_t N);
int64_t matmul_bias_chunks(int64_t N);

// The per-chunk partial sums: chunks x C floats (two such arrays for LayerNorm's weight and bias).
size_t rmsnorm_backward_scratch_bytes(int64_t N, int C);
size_t layernorm_backward_scratch_bytes(int64_t N, int C);
size_t matmul_backward_scratch_bytes(int64_t N, int OC);  // with a bias gradient; none without

// ColumnSums::reserve's bytes for `floats` partial sums, rounded to its 256-byte alignment.
size_t column_sums_reserved_bytes(int64_t floats);

// Flash attention's backward: D (the rows' dO.O) with one float per (b, query head, t), 256-byte aligned.
size_t flash_attention_backward_scratch_bytes(int B, int T_, int NH, int NKV, int hs);
size_t flash_attention_backward_scratch_bytes(int B, int T_, int C, int NH);  // GPT-2: NKV = NH, hs = C / NH

// An upper bound on cub::DeviceRadixSort::SortPairs's temporary storage for n int32 keys with int32 values (not
// double-buffered): CUB's alternate key and value arrays (4 n bytes each), its per-tile look-back or spine counters
// (at most 4 bytes per item: one 4-byte counter per radix digit and tile of >= 256 items), and 1 MiB for its
// per-pass histograms, alignment padding and the single-tile paths.
size_t cub_sort_pairs_temp_bound(int64_t n);

// embedding_backward's scratch: positions, sorted tokens, sorted positions (B*T int32 each, 256-byte aligned),
// then CUB's temporary storage within cub_sort_pairs_temp_bound(B*T). B*T must fit in int.
size_t embedding_backward_scratch_bytes(int B, int T_, int C);
// Where CUB's temporary storage starts in that scratch, and how much room it has.
size_t embedding_sort_temp_offset(int B, int T_);

// An upper bound on the kernel scratch of cuDNN's fused attention (forward and backward share it) at [B, T_] with
// NH query heads, NKV key/value heads and head size hs. cuDNN's workspace is bounded by a score-sized buffer at the
// sequence padded to 128 rows, Tp (B NH Tp^2 x 2 bytes: Hopper's deterministic backward keeps dS for every head),
// plus an fp32 dQ accumulator (B NH Tp hs x 4) and 16 MiB; then come the backward's row sums (B NH T x 4) and, for
// the nondeterministic backward, its own fp32 dQ accumulator (B NH T hs x 4), each 256-byte aligned.
size_t cudnn_attention_scratch_bound(int B, int T_, int NH, int NKV, int hs);

// gpu::nf4_quantize's scratch for n weights (kernels/gpu/nf4.h): the first non-finite weight's index (8 bytes), one
// double per group of 256 blocks (the group's absmaxes summed in order) and one float per block of 64 weights (its
// absmax), in that order.
size_t nf4_quantize_scratch_bytes(int64_t n);

// gpu::fp8_quantize_matrix's scratch for `groups` scale groups (kernels/gpu/fp8.h): the first non-finite element's
// index (8 bytes), then each group's absolute maximum and scale (two floats).
size_t fp8_quantize_scratch_bytes(int64_t groups);

// Keys per split of decode_attention_at's split-K path (kernels/gpu/decode_attention.h), and the rows at most that
// take it: a decoding step's one query per head would otherwise be NH blocks walking the whole cache one tile after
// another.
inline constexpr int kDecodeSplitKeys = 64;
inline constexpr int kDecodeSplitMaxRows = 4;
// The scratch decode_attention_at needs (0 for more than kDecodeSplitMaxRows rows): each (row, head, split)'s partial
// softmax (hs sums, the running max and the sum of exponentials, in fp32), for caches of max_len positions.
size_t decode_attention_at_scratch_bytes(int rows, int NH, int hs, int max_len);

// gpu::sample_rows's chunks (kernels/gpu/sample.h): a block scores kSampleChunk ids of a row.
inline constexpr int kSampleChunk = 4096;
int sample_chunks(int V);
// Its scratch for `rows` rows of V logits: each (row, chunk)'s best candidate (16 bytes), then each row's k-th
// candidate (8 bytes).
size_t sample_rows_scratch_bytes(int rows, int V);

// gpu::argmax_rows's chunks (kernels/gpu/argmax.h): a block takes the best of kArgmaxChunk ids of a row, then a warp
// the best of the row's chunks. Its scratch: each (row, chunk)'s best (12 bytes).
inline constexpr int kArgmaxChunk = 2048;
int argmax_chunks(int V);
size_t argmax_rows_scratch_bytes(int rows, int V);

// A GPU decoder's kernel scratch for a step of up to max_batch rows: the split-K attention's partials, then, in the
// same bytes, sample_rows's candidates or argmax_rows's chunks.
size_t decode_step_scratch_bytes(int max_batch, int NH, int hs, int max_len, int V);

}  // namespace st::gpu
