// Bulk reads of checkpoint files: one ordered pass that hashes a whole file and copies the wanted ranges out on the
// way, and parallel reads of a range of a file in the page cache.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/unique_fd.h"

namespace st {

// File bytes [offset, offset + bytes), wanted at `out`.
struct WantedBytes {
  int64_t offset = 0;
  int64_t bytes = 0;
  void* out = nullptr;
};

// Reads the whole file once and returns its digest with piece_bytes; on the way, the bytes of each `wanted` range are
// copied to its `out`, so that a load reads its file once and checks what it read. The file is read in order,
// 64 MiB at a time through the page cache (as `dd bs=64M` reads), while four threads hash the pieces and copy the
// wanted bytes of the reads before. The caller compares the digest before it uses the copies: they hold what the file
// held, whatever that was.
//
// kBadInput naming the path if it cannot be opened, or if a wanted range passes the file's end; kFault naming the path
// and the byte if a read fails after that or the file ends early.
std::string digest_and_read(const std::string& path, int64_t piece_bytes, const std::vector<WantedBytes>& wanted);

// digest_and_read in several calls, for a reader that uses (and lets go of) what each call wanted before the next:
// each read() goes on through the file, in order, up to the end of the digest piece that holds its last wanted byte,
// and finish() reads the rest and returns the digest. The bytes read past a call's last wanted byte (less than a
// piece) are kept for the next call; a range that an earlier call passed further back is read again from the file.
// The caller compares the digest before it trusts what was read, as with digest_and_read.
//
//   FilePassInParts pass(path, kDigestPieceBytes);
//   for (unit : units) { pass.read(wanted_of(unit)); use(unit); }
//   check(pass.finish());
class FilePassInParts {
 public:
  FilePassInParts(const std::string& path, int64_t piece_bytes);  // piece_bytes > 0; kBadInput if it cannot be opened
  FilePassInParts(const FilePassInParts&) = delete;
  FilePassInParts& operator=(const FilePassInParts&) = delete;
  ~FilePassInParts();
  // Copies each range to its out (kBadInput naming the path if one passes the file's end).
  void read(const std::vector<WantedBytes>& wanted);
  std::string finish();

 private:
  std::string path_;
  int64_t piece_bytes_ = 0;
  UniqueFd fd_;
  int64_t size_ = 0;
  int64_t read_ = 0;      // bytes [0, read_) were read and hashed
  int64_t carry_at_ = 0;  // carry_ holds bytes [carry_at_, read_)
  std::string carry_;
  std::vector<std::array<unsigned char, 32>> digests_;  // the pieces hashed so far
};

// Reads `bytes` bytes of the open file `fd` at `offset` into `out`, in reads of up to 16 MiB on up to four threads (a
// file in the page cache copies several times faster than one read(2) at a time). `path` is for messages: a failed
// read or an early end of the file is kFault naming it and the byte.
void read_at(int fd, const std::string& path, int64_t offset, int64_t bytes, void* out);

}  // namespace st
