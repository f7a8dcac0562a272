// The on-disk formats of llm.c token shards and of their loss masks (docs/data-format.md describes them for users).
// The reader is llmc_source.h, the writer llmc_writer.h; both take every number from here.
//
// Token shard (all little-endian): a header of 256 int32 (1024 bytes), then N tokens.
//   uint16 tokens (llm.c's GPT-2 shards):   header[0] = 20240520, header[1] = 1
//   uint32 tokens (llm.c's Llama 3 shards): header[0] = 20240801, header[1] = 7
//   header[2] = N >= 1; the file is exactly 1024 + N * (2 or 4) bytes.
// Loss mask of the token shard NAME.bin: NAME.mask in the same directory (mask_path_for()).
//   header[0] = 20261201, header[1] = 2, header[2] = N (the token shard's N), header[3] and header[4] = the low and
//   high 32 bits of the token shard's content hash (LlmcContentHash); then N uint8, byte i = 1 if token i is a
//   training target (its prediction from the tokens before it counts in the loss), 0 if not. The file is exactly
//   1024 + N bytes. Version 1 is the same without the hash (header[3..4] unused): readers take it, with a warning.
// A set that `shardtrain tokenize --out PREFIX` is writing, or that it left when killed, has the marker
// PREFIX.incomplete beside it (incomplete_marker_for()); readers refuse its shards.
//
//   st::mask_path_for("data/train_000.bin") == "data/train_000.mask"
//   st::incomplete_marker_for("data/chat_train_000003.bin") == "data/chat.incomplete"
#pragma once

#include <cstddef>
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
// Loss masks: version 2 (written) records its token shard's content hash in header[3] (low 32 bits) and header[4]
// (high); version 1 (still read) records none.
inline constexpr int32_t kLlmcMaskMagic = 20261201;
inline constexpr int32_t kLlmcMaskVersion = 2;
inline constexpr int32_t kLlmcMaskVersionUnbound = 1;
inline constexpr int64_t kLlmcMaskShardHashLo = 3;
inline constexpr int64_t kLlmcMaskShardHashHi = 4;

// The largest vocabulary whose tokens fit uint16 shards; a larger one needs uint32 shards.
inline constexpr int64_t kLlmcU16Vocab = 65536;
// The most tokens one shard (or mask) can hold: header[2] is an int32.
inline constexpr int64_t kLlmcMaxTokens = 2147483647;

// The loss mask's path for the token shard at `shard_path`: a final ".bin" replaced by ".mask", else ".mask"
// appended. Masks never end in .bin, so a data glob such as "train_*.bin" never matches one.
std::string mask_path_for(const std::string& shard_path);

// The marker of an incomplete tokenize output set (see above) for its PREFIX: PREFIX.incomplete.
std::string incomplete_marker_for_prefix(const std::string& prefix);
// The marker of the set a shard named PREFIX_train_<digits>.bin or PREFIX_val_<digits>.bin belongs to:
// PREFIX.incomplete; "" for a name of another form.
std::string incomplete_marker_for(const std::string& shard_path);

// A token shard's content hash, which its loss mask records: over the shard's token bytes (the file from byte 1024)
// read as little-endian uint64 words w_0, w_1, ... (the last padded with zero bytes), the sum modulo 2^64 of
// mix(w_i + (i + 1) * 0x9E3779B97F4A7C15) for every i, plus mix(the number of token bytes), where mix is SplitMix64's
// finalizer. A changed, moved, added or missing byte changes it (but by chance, 1 in 2^64). The terms are
// independent, so pieces of a file hash side by side and add up (hash_words). docs/data-format.md has it in Python.
//
//   LlmcContentHash h;  h.update(tokens, bytes);  ...;  const uint64_t v = h.value();
class LlmcContentHash {
 public:
  // The next `n` token bytes, in file order, in pieces of any size.
  void update(const void* bytes, size_t n);
  // The hash of the bytes given so far.
  uint64_t value() const;

  // The sum of the terms of the words in p[0, n), the first being word `first_word` of the file's token bytes; n is
  // a multiple of 8, except for the last piece of a file (then padded with zero bytes).
  static uint64_t hash_words(const uint8_t* p, size_t n, uint64_t first_word);
  // The hash from the sum of every word's term and the number of token bytes.
  static uint64_t finish(uint64_t sum, uint64_t bytes);

 private:
  uint64_t sum_ = 0, bytes_ = 0;
  uint8_t partial_[8] = {};  // the bytes of a word not yet complete
  size_t partial_n_ = 0;
};

// The token width, in bits, that a vocabulary of `vocab_size` (> 0) tokens needs: 16 when vocab_size <= 65536,
// else 32.
int llmc_token_bits(int64_t vocab_size);

}  // namespace st
