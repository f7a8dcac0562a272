// Attention of new queries against a key/value cache on the GPU: the CUDA version of decode_attention_at and
// kv_append_at (kernels/decode_attention.h), same operands and meaning, for T in {float, bf16, fp16} (q, the cache and
// out in T; scores, softmax and sums in fp32). Device pointers, the positions in device memory, asynchronous on
// ctx.stream. A prompt's rows are one sequence's (seq_stride 0, positions pos .. pos + n - 1); a batched decoding
// step's are a row per sequence.
//
// Many rows: one block per (row, head) walks the visible keys in tiles of kDecodeAttentionTile with an online softmax
// (a running max and sum, the accumulator rescaled when the max grows), in a fixed order: reruns are bit-identical.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/decode_attention.h"
#include "shardtrain/kernels/gpu/context.h"
#include "shardtrain/kernels/scratch_sizes.h"

namespace st::gpu {

// Keys a block scores at a time.
inline constexpr int kDecodeAttentionTile = 64;
// The largest head size: each of the block's 128 threads keeps 4 of a head's output values.
inline constexpr int kDecodeAttentionMaxHeadSize = 512;

// As st::decode_attention_at and st::kv_append_at: row r's cache at k_cache / v_cache + r seq_stride, its position
// positions[r] (device memory), so that a captured decoding step runs at any position below max_len. Up to
// kDecodeSplitMaxRows rows split each row's keys into blocks of kDecodeSplitKeys (a fixed grid over max_len; splits
// past a row's length return at once), merged in split order by a second kernel, or, given `arrivals` (rows x NH
// counters in device memory, zero at the call and left zero), by the last split of each (row, head) to finish, in
// the same kernel and with the same bits; more rows take one block per (row, head). Deterministic either way.
template <typename T>
void decode_attention_at(T* out, const T* q, int64_t q_stride, const T* k_cache, const T* v_cache, int64_t seq_stride,
                         const int32_t* positions, int rows, int NH, int NKV, int hs, int max_len,
                         const GpuContext& ctx, unsigned* arrivals = nullptr);
template <typename T>
void kv_append_at(T* k_cache, T* v_cache, const T* qkv, int64_t seq_stride, const int32_t* positions, int rows, int NH,
                  int NKV, int hs, const GpuContext& ctx);
// As st::rope_kv_append_at: one kernel turns the query and key heads and appends the keys and values.
template <typename T>
void rope_kv_append_at(T* qkv, T* k_cache, T* v_cache, const float* cos, const float* sin, int64_t seq_stride,
                       const int32_t* positions, int rows, int NH, int NKV, int hs, const GpuContext& ctx);
// rope_kv_append_at, then decode_attention_at over the fused qkv rows [rows, (NH + 2 NKV) hs] (arrivals as there):
// out and the caches get the bits of those two calls. Where each row's new key is the only new key it sees (a cache
// per row, seq_stride != 0, or a single row) and the split-K path serves (rows <= kDecodeSplitMaxRows), it is one
// kernel: each split turns its query head itself and the split that holds a row's position turns its new key, which
// the first query head of each key/value head appends; qkv is then left unturned. Otherwise the two calls run.
template <typename T>
void rope_append_attend_at(T* out, T* qkv, T* k_cache, T* v_cache, const float* cos, const float* sin,
                           int64_t seq_stride, const int32_t* positions, int rows, int NH, int NKV, int hs, int max_len,
                           const GpuContext& ctx, unsigned* arrivals = nullptr);

}  // namespace st::gpu
