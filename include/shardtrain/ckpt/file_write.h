// The checkpoint writer: the bytes of a file laid out by a format library (HDF5), rewritten in order in large direct
// writes while their digest is computed beside them.
#pragma once

#include <cstdint>
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

}  // namespace st
