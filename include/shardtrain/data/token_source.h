// TokenSource: a read-only, random-access stream of int32 tokens. The training data, whatever its
// on-disk form (llm.c shards, raw text, the built-in corpus, a slice of any of these), is one of these.
//
// Contract:
//   * size() tokens, addressed by a 64-bit offset in [0, size()).
//   * Every token is in [0, vocab_size()): sources validate this when they are opened, so a read never
//     meets a bad token and training never starts on bad data.
//   * read() is const and thread-safe (it only reads immutable mappings), so several threads may read.
//   * Concatenated files read as ONE stream: offsets run across file boundaries without a gap.
//   * A stream may carry a loss mask (llm.c shards with .mask files, docs/data-format.md): one byte a token, 1 if
//     the token is a training target (its prediction from the tokens before it counts in the loss), 0 if not.
//     A stream without one reads as all 1: every token is a target.
//
//   std::vector<int32_t> buf(65);
//   src.read(/*offset=*/64 * w, /*count=*/65, buf.data());
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "shardtrain/core/error.h"

namespace st {

class TokenSource {
 public:
  virtual ~TokenSource() = default;

  // Number of tokens in the stream.
  virtual int64_t size() const = 0;
  // Copies tokens [offset, offset + count) into out[0 .. count). Needs 0 <= offset and
  // offset + count <= size() (else an internal error); count == 0 is a no-op.
  virtual void read(int64_t offset, int64_t count, int32_t* out) const = 0;
  // One line for logs: the kind, the path(s), the number of files and tokens.
  virtual std::string describe() const = 0;
  // An exclusive upper bound on the token values of this stream.
  virtual int vocab_size() const = 0;
  // Whether the stream carries a loss mask.
  virtual bool has_loss_mask() const { return false; }
  // Copies mask bytes [offset, offset + count) into out[0 .. count), each 0 or 1; same bounds as read(). Without a
  // loss mask every byte is 1.
  virtual void read_mask(int64_t offset, int64_t count, uint8_t* out) const {
    ST_CHECK(offset >= 0 && count >= 0 && offset <= size() - count, "mask read [", offset, ", +", count,
             ") outside a stream of ", size(), " tokens (", describe(), ")");
    std::fill(out, out + count, uint8_t{1});
  }
};

}  // namespace st
