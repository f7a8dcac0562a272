// Durable file operations for the checkpoint commit protocol. HDF5 never calls fsync itself, so the
// protocol does: a file's data, then its directory entry.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace st {

// fsync(2) of a file or directory by path; kFault naming the path and errno text on failure.
void fsync_path(const std::string& path);
// Writes `text` to `path` via `path.tmp-<pid>`: write, fsync, rename, fsync the directory.
void write_file_atomic(const std::string& path, const std::string& text);
std::string read_file(const std::string& path);  // kBadInput naming the path if it cannot be read
int64_t file_size(const std::string& path);      // kBadInput naming the path if missing

// kBadInput unless the directory that `path` is written into (its parent; "." if none) exists and is a
// directory. `what` names the setting in the message ("ckpt export --out", "ckpt.export").
void check_output_dir(const std::string& path, const std::string& what);

// Deletes a file (or a directory with its contents) when it goes out of scope unless dismissed: a write that fails half
// way leaves nothing behind.
//
//   RemoveOnFailure cleanup(tmp);
//   write(tmp); rename(tmp, path);
//   cleanup.dismiss();
class RemoveOnFailure {
 public:
  explicit RemoveOnFailure(std::string path) : path_(std::move(path)) {}
  RemoveOnFailure(const RemoveOnFailure&) = delete;
  RemoveOnFailure& operator=(const RemoveOnFailure&) = delete;
  ~RemoveOnFailure();
  void dismiss() { path_.clear(); }

 private:
  std::string path_;
};

// SHA-256 (OpenSSL libcrypto) of a whole file, lowercase hex: file_digest(path, 0).
std::string sha256_file(const std::string& path);
std::string sha256_hex(const void* data, size_t bytes);

// A checkpoint file's digest (docs/checkpoint-format.md, "Digests"), lowercase hex. With piece_bytes > 0 it is the
// SHA-256 of the SHA-256 digests (32 bytes each, in file order) of the file's consecutive piece_bytes pieces, the
// last one shorter (a file of no bytes has no pieces: the SHA-256 of nothing). Threads hash the pieces side by side,
// so the digest keeps up with a disk that writes or reads faster than one core computes SHA-256 (that section gives
// the rates). With piece_bytes == 0 it is the SHA-256 of the whole file, as format version 1 manifests record it.
inline constexpr int64_t kDigestPieceBytes = int64_t{16} << 20;  // what writers use
inline constexpr int64_t kMinDigestPieceBytes = 4096;            // the range a manifest may give
inline constexpr int64_t kMaxDigestPieceBytes = int64_t{1} << 30;

// The digest of bytes in memory.
std::string digest_hex(const void* data, size_t bytes, int64_t piece_bytes);
// The digest of a file: digest_and_read with nothing wanted.
std::string file_digest(const std::string& path, int64_t piece_bytes);

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

// Reads `bytes` bytes of the open file `fd` at `offset` into `out`, in reads of up to 16 MiB on up to four threads (a
// file in the page cache copies several times faster than one read(2) at a time). `path` is for messages: a failed
// read or an early end of the file is kFault naming it and the byte.
void read_at(int fd, const std::string& path, int64_t offset, int64_t bytes, void* out);

// The digest of bytes that come in order in pieces of any size (a file received over the network, hashed as it
// arrives), on the calling thread.
class DigestStream {
 public:
  explicit DigestStream(int64_t piece_bytes);
  ~DigestStream();
  DigestStream(const DigestStream&) = delete;
  DigestStream& operator=(const DigestStream&) = delete;
  void update(const void* data, size_t bytes);
  std::string hex();  // ends the stream (call once)

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

// What a writer put on disk: the file's length and its digest (equal to file_digest(path, piece_bytes)), computed
// from memory while the bytes were written.
struct WrittenFile {
  int64_t bytes = 0;
  std::string digest;
};

// Bytes from memory placed at a file offset.
struct PlacedBytes {
  int64_t offset = 0;
  const void* data = nullptr;
  int64_t bytes = 0;
};

// Writes `pieces` into the existing file `path` at their offsets, fsyncs it and returns its length and
// digest with piece_bytes (> 0). Pieces must not overlap and must lie inside the file (ST_CHECK); the bytes between
// them keep what the file holds (they are read back first, so they should be small: a format's metadata). The file's
// length does not change.
//
// The file's blocks are reserved first (fallocate), then the whole file is rewritten in file order in 16 MiB
// writes, four in flight, with O_DIRECT where the file system allows it (a file system that refuses O_DIRECT,
// e.g. tmpfs before Linux 6.6, gets writes through the page cache), and the last partial 4 KiB block through the
// page cache. Four other threads hash the same bytes' pieces from memory meanwhile. Overwriting a file that already has
// its length (HDF5 sets it when it closes) lets the direct writes run side by side, which extending writes on
// ext4 do not. The 64 MiB of staging buffers stay mapped for the process's next call. Measurements:
// docs/performance.md, "Checkpoint writes and loads".
//
// A failed reservation, write, fsync or close (ENOSPC, EFBIG past RLIMIT_FSIZE with SIGXFSZ ignored, EIO, a
// write that makes no progress) is kFault naming the path and the OS's error text; the partially written file
// stays for the caller to remove.
WrittenFile overwrite_file(const std::string& path, std::vector<PlacedBytes> pieces, int64_t piece_bytes);

}  // namespace st
