// The on-disk formats of llm.c token shards and of their loss masks (docs/data-format.md describes them for users).
// The reader is llmc_source.h, the writer llmc_writer.h; both take every number from here.
//
// Token shard (all little-endian): a header of 256 int32 (1024 bytes), then N tokens.
//   uint16 tokens (llm.c's GPT-2 shards):   header[0] = 20240520, header[1] = 1
//   uint32 tokens (llm.c's Llama 3 shards): header[0] = 20240801, header[1] = 7
//   header[2] = N >= 1; the file is exactly 1024 + N * (2 or 4) bytes.
// Loss mask of the token shard NAME.bin: NAME.mask in the same directory (mask_path_for()).
//   header[0] = 20261201, header[1] = 1, header[2] = N (the token shard's N); then N uint8, byte i = 1 if token i
//   is a training target (its prediction from the tokens before it counts in the loss), 0 if not. The file is
//   exactly 1024 + N bytes.
//
//   st::mask_path_for("data/train_000.bin") == "data/train_000.mask"
#pragma once

#include <cstdint>
#include <string>

namespace st {

inline constexpr int64_t kLlmcHeaderInts = 256;
inline constexpr int64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;

// uint16 token shards.
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
// uint32 token shards (llm.c's dev/data scripts write these for Llama 3's vocabulary).
inline constexpr int32_t kLlmcMagic32 = 20240801;
inline constexpr int32_t kLlmcVersion32 = 7;
// Loss masks.
inline constexpr int32_t kLlmcMaskMagic = 20261201;
inline constexpr int32_t kLlmcMaskVersion = 1;

// The largest vocabulary whose tokens fit uint16 shards; a larger one needs uint32 shards.
inline constexpr int64_t kLlmcU16Vocab = 65536;
// The most tokens one shard (or mask) can hold: header[2] is an int32.
inline constexpr int64_t kLlmcMaxTokens = 2147483647;

// The loss mask's path for the token shard at `shard_path`: a final ".bin" replaced by ".mask", else ".mask"
// appended. Masks never end in .bin, so a data glob such as "train_*.bin" never matches one.
std::string mask_path_for(const std::string& shard_path);

// The token width, in bits, that a vocabulary of `vocab_size` (> 0) tokens needs: 16 when vocab_size <= 65536,
// else 32.
int llmc_token_bits(int64_t vocab_size);

}  // namespace st
