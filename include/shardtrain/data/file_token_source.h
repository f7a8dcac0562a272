// FileTokenSource: the TokenSource behind every on-disk format. It concatenates the token payloads of
// one or more memory-mapped files into one stream, in the order given: file 0's tokens, then file 1's...
// Each file stores its tokens at its own width (an llm.c glob may mix uint16 and uint32 shards). With loss masks,
// every file has one, and mask byte i of a file belongs to its token i, so the masks concatenate like the tokens.
//
// It does no format validation; the format openers (llmc_source.h, text_source.h, fortunes.h) check
// headers, sizes, token values and mask bytes and then hand it the payloads. It owns the mappings.
//
//   std::vector<st::FilePayload> files;
//   files.push_back({st::MappedFile("a.txt"), /*byte_offset=*/0, /*count=*/bytes_of_a, st::TokenWidth::kU8});
//   st::FileTokenSource src(std::move(files), 256, "text 'a.txt'");
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/data/mapped_file.h"
#include "shardtrain/data/token_source.h"

namespace st {

// How one token is stored: one byte (raw text), or a little-endian uint16 or uint32 (llm.c shards).
enum class TokenWidth { kU8 = 1, kU16 = 2, kU32 = 4 };

// One file's part of the stream: `count` tokens of `width` stored from byte `byte_offset` of `file`.
struct FilePayload {
  MappedFile file;
  int64_t byte_offset = 0;
  int64_t count = 0;
  TokenWidth width = TokenWidth::kU16;
};

// One file's loss mask: as many bytes as its tokens, stored from byte `byte_offset` of `file`.
struct MaskPayload {
  MappedFile file;
  int64_t byte_offset = 0;
};

class FileTokenSource final : public TokenSource {
 public:
  // Needs byte_offset + count * width <= file.size() for every file (an internal error otherwise: the
  // openers check it with a user-facing message first) and every stored token < vocab_size. `masks` is empty (no
  // loss mask) or holds one mask per file, in the same order, each with room for its file's count bytes and every
  // byte 0 or 1.
  FileTokenSource(std::vector<FilePayload> files, int vocab_size, std::string description,
                  std::vector<MaskPayload> masks = {});

  int64_t size() const override { return starts_.back(); }
  void read(int64_t offset, int64_t count, int32_t* out) const override;
  std::string describe() const override { return description_; }
  int vocab_size() const override { return vocab_size_; }
  bool has_loss_mask() const override { return !masks_.empty(); }
  void read_mask(int64_t offset, int64_t count, uint8_t* out) const override;

  int64_t num_files() const { return static_cast<int64_t>(files_.size()); }
  // The first stream offset of file i; file_start(num_files()) == size().
  int64_t file_start(int64_t i) const { return starts_.at(static_cast<size_t>(i)); }
  const std::string& file_path(int64_t i) const { return files_.at(static_cast<size_t>(i)).file.path(); }
  TokenWidth file_width(int64_t i) const { return files_.at(static_cast<size_t>(i)).width; }

 private:
  // Calls piece(file, first, n) for the pieces of [offset, offset + count) that lie in one file each, in order:
  // tokens [first, first + n) of file `file`.
  template <typename Piece>
  void for_each_piece(int64_t offset, int64_t count, Piece&& piece) const;

  std::vector<FilePayload> files_;
  std::vector<MaskPayload> masks_;
  std::vector<int64_t> starts_;  // size num_files() + 1, starts_[0] == 0
  int vocab_size_;
  std::string description_;
};

}  // namespace st
