// LlmcShardWriter: writes one llm.c token shard, and optionally its loss mask, in the formats of llmc_format.h
// (docs/data-format.md), streaming: tokens (and mask bytes) go in by write() calls of any length, and close() makes
// the files appear under their final names.
//
// Durability and atomicity: the data goes to temporary files beside the final ones (PATH.tmp.XXXXXX and
// MASK.tmp.XXXXXX, which match neither *.bin nor *.mask), whose headers are written last; close() fsyncs them,
// renames the mask into place first and the shard second, and fsyncs the directory. So no half-written shard ever
// carries its final name, and a reader that sees the shard sees its mask. The mask (version 2) records the shard's
// content hash (LlmcContentHash), computed as the tokens are written, so a reader can tell it from another shard's.
// Any failure (ENOSPC, EFBIG, EIO, a directory that cannot be written...) throws naming the final path, and leaves
// nothing under the final names and no temporary behind; so does an object destroyed without close() (an exception
// in the caller). Files are created with mode 0644.
//
// Only new files: a shard that exists, or a file at its mask path (a shard written without a mask would be read with
// it), is refused by the constructor; the renames never replace a file that appeared meanwhile (rename_no_replace),
// which is refused too, leaving that file as it was.
//
// Errors: a file that cannot be created (a missing or read-only directory), a target that exists, and values that do
// not fit the format (a token outside [0, 2^bits), a mask byte other than 0 and 1, more than 2^31 - 1 tokens, a shard
// of no token) are kBadInput; a failing write, fsync, close or rename is kFault.
//
//   st::LlmcShardWriter w("out/train_000000.bin", st::llmc_token_bits(vocab_size), /*with_mask=*/true);
//   w.write(tokens.data(), mask.data(), n);   // any number of times
//   w.close();                                 // out/train_000000.mask, then out/train_000000.bin, appear
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/unique_fd.h"
#include "shardtrain/data/llmc_format.h"

namespace st {

class LlmcShardWriter {
 public:
  // Creates the temporary files for the shard at `path` (the mask's is mask_path_for(path)). token_bits: 16
  // (magic 20240520, version 1) or 32 (magic 20240801, version 7); llmc_token_bits(vocab_size) picks it.
  LlmcShardWriter(std::string path, int token_bits, bool with_mask);
  // Without close(): removes the temporaries; nothing appears under the final names.
  ~LlmcShardWriter();
  LlmcShardWriter(const LlmcShardWriter&) = delete;
  LlmcShardWriter& operator=(const LlmcShardWriter&) = delete;

  // Appends n tokens, each in [0, 2^token_bits). Only for a writer without a mask.
  void write(const int32_t* tokens, int64_t n);
  // Appends n tokens and their n mask bytes (1: the token is a training target, 0: it is not). Only with a mask.
  void write(const int32_t* tokens, const uint8_t* mask, int64_t n);
  // Writes the headers, fsyncs, and renames the mask (if any) and then the shard into place. Needs at least one
  // token. Once closed (or after a failure) the writer takes no more calls.
  void close();

  const std::string& path() const { return path_; }
  const std::string& mask_path() const { return mask_path_; }  // "" without a mask
  int token_bits() const { return token_bits_; }
  int64_t tokens() const { return count_; }

 private:
  // One file being written: its temporary name and descriptor, and the bytes not yet written to it.
  struct Out {
    std::string final_path, tmp_path;
    UniqueFd fd;
    std::vector<uint8_t> buffer;
  };
  void open_out(Out& out, const std::string& final_path);
  void append(Out& out, const void* bytes, size_t n);
  void flush(Out& out);
  // Writes the header (a mask's with shard_hash), fsyncs and closes.
  void finish(Out& out, int32_t magic, int32_t version, uint64_t shard_hash = 0);
  // Renames out's temporary to final_path unless something is there (then kBadInput, after discard()).
  void commit(Out& out, const std::string& final_path);
  void check_open(const char* call) const;
  // Removes what exists of the temporaries (and, from close(), what it already renamed into place); never throws.
  void discard() noexcept;
  // discard(), then throws kFault naming the shard, `what` and errno's text.
  [[noreturn]] void fail(const std::string& what, int err);

  std::string path_, mask_path_;
  int token_bits_;
  int64_t count_ = 0;
  bool open_ = false;
  // close(): the mask, the shard, holds its final name (a failure after it removes it again).
  bool mask_renamed_ = false, shard_renamed_ = false;
  Out tokens_, mask_;
  std::vector<uint8_t> staging_;  // one write() call's tokens at the shard's width
  LlmcContentHash content_hash_;  // of the token bytes written, for the mask's header
};

}  // namespace st
