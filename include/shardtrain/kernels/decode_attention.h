// Attention of new queries against a key/value cache: the attention step of decoding with a KV cache (one new token
// a step, or a prompt's tokens at once), with grouped-query attention. CPU fp32 reference; the CUDA version
// (kernels/gpu/decode_attention.h) shares the signature.
//
//   // the n new tokens' keys and values are already in the cache at positions pos .. pos + n - 1
//   decode_attention(out, qkv, QKV, k_cache, v_cache, n, pos, NH, NKV, hs);
#pragma once

#include <cstdint>

namespace st {

// n queries at positions pos .. pos + n - 1 against the cache's keys and values at positions 0 .. pos + n - 1 (the
// queries' own included): query i attends to keys 0 .. pos + i (causal), with scores q.k / sqrt(hs) and a softmax
// over them. Query i's NH heads are the NH hs values at q + i * q_stride (q_stride >= NH hs: q may point into the
// fused qkv rows of attention.h, q_stride = (NH + 2 NKV) hs); k_cache and v_cache are [>= pos + n, NKV hs],
// position-major; query head h reads K/V head h / (NH / NKV). Overwrites out [n, NH hs] (heads concatenated).
// NH must be a positive multiple of NKV, n >= 1, pos >= 0.
void decode_attention(float* out, const float* q, int64_t q_stride, const float* k_cache, const float* v_cache, int n,
                      int pos, int NH, int NKV, int hs);

// A decoding step of `rows` sequences, one query each, whatever their positions: row r's query (at q + r q_stride)
// attends to keys 0 .. positions[r] of its own cache, k_cache and v_cache + r seq_stride ([>= positions[r] + 1, NKV
// hs] each); every position is below max_len, the caches' length. A negative position makes the row idle (a
// sequence that sits a batched step out): its output is zeros. Overwrites out [rows, NH hs].
void decode_attention_at(float* out, const float* q, int64_t q_stride, const float* k_cache, const float* v_cache,
                         int64_t seq_stride, const int32_t* positions, int rows, int NH, int NKV, int hs, int max_len);

// Copies the key and value heads of `rows` fused qkv rows [rows, (NH + 2 NKV) hs] into position positions[r] of row
// r's cache (k_cache and v_cache + r seq_stride, position-major [., NKV hs]); an idle row (negative position) writes
// nothing.
void kv_append_at(float* k_cache, float* v_cache, const float* qkv, int64_t seq_stride, const int32_t* positions,
                  int rows, int NH, int NKV, int hs);

// rope_forward_at (kernels/rope.h), then kv_append_at: a decoding step's query and key heads turned by RoPE in place
// at each row's position, and the turned keys with the values into the cache, in one pass on the GPU.
void rope_kv_append_at(float* qkv, float* k_cache, float* v_cache, const float* cos, const float* sin,
                       int64_t seq_stride, const int32_t* positions, int rows, int NH, int NKV, int hs);

// rope_kv_append_at, then decode_attention_at over the fused qkv rows [rows, (NH + 2 NKV) hs]: a decoding step's
// attention with RoPE, whole (one kernel on the GPU for a step's few rows, which may leave qkv unturned there).
void rope_append_attend_at(float* out, float* qkv, float* k_cache, float* v_cache, const float* cos, const float* sin,
                           int64_t seq_stride, const int32_t* positions, int rows, int NH, int NKV, int hs,
                           int max_len);

}  // namespace st
