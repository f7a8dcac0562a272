// The checkpoint writer: the bytes of a file laid out by a format library (HDF5), rewritten in order in large direct
// writes while their digest is computed beside them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace st {

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

// overwrite_file for bytes that are not all in memory at once: group g's pieces are acquire(g)'s, whose memory must
// stay valid until release(g) (called once each, also when the write fails), which comes before acquire(g + 1).
// Groups come in file order: every piece of a group lies after those of the groups before. Each group's bytes are
// written and hashed up to the last multiple of the digest piece (and of the 4 KiB direct-write block) that they
// reach, and the bytes after it (less than a piece) are copied and go out with the next group's, so that the
// writer itself holds at most one piece besides its 64 MiB of buffers. The file's bytes and digest are
// overwrite_file's.
//
//   overwrite_file_in_groups(path, units, [&](int64_t u) { pull(u); return pieces_of(u); },
//                            [&](int64_t u) { free(u); }, kDigestPieceBytes);
WrittenFile overwrite_file_in_groups(const std::string& path, int64_t groups,
                                     const std::function<std::vector<PlacedBytes>(int64_t)>& acquire,
                                     const std::function<void(int64_t)>& release, int64_t piece_bytes);

}  // namespace st
