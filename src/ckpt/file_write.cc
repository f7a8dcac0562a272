// The checkpoint writer: a file rewritten in order in large direct writes, its digest hashed beside them.
#include "shardtrain/ckpt/file_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <numeric>

#include "bulk_io.h"
#include "digest_internal.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/unique_fd.h"

namespace st {

using file_io_internal::BackgroundDigest;
using file_io_internal::for_each_index;
using file_io_internal::IoBuffers;
using file_io_internal::kIoBytes;
using file_io_internal::pread_exact;
using file_io_internal::Runs;

namespace {

// kIoBytes writes in flight: 16 MiB x 4 wrote as fast as any size and count tried (docs/performance.md, "Checkpoint
// writes and loads"), and 64 MiB is all the memory a write holds.
constexpr int kWritesInFlight = 4;
// O_DIRECT needs buffers, offsets and lengths aligned to the device's logical block: 4096 covers 512-byte
// and 4 KiB devices alike.
constexpr size_t kDirectAlign = 4096;

// The first failed system call of a write: errno and the file offset it failed at.
struct WriteFailure {
  int err = 0;
  int64_t offset = 0;
  bool failed() const { return err != 0; }
};

// pwrite(2) of all n bytes at `offset`, resuming after short writes. A write that makes no progress is
// reported as ENOSPC, which is what it means on a regular file.
WriteFailure pwrite_all(int fd, const char* buf, size_t n, int64_t offset) {
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd, buf + done, n - done, offset + static_cast<int64_t>(done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return {w < 0 ? errno : ENOSPC, offset + static_cast<int64_t>(done)};
    done += static_cast<size_t>(w);
  }
  return {};
}

// Writes file bytes [begin, end) through fd in kIoBytes pieces, one thread per buffer, each gathering its
// piece from `runs` (which hold file bytes from `base` on) into its own buffer (aligned, so that fd may be O_DIRECT).
// Returns the first failure; the other threads stop at their next piece.
WriteFailure write_pieces(int fd, const Runs& runs, int64_t base, int64_t begin, int64_t end,
                          const IoBuffers& buffers) {
  const int64_t pieces = (end - begin + static_cast<int64_t>(kIoBytes) - 1) / static_cast<int64_t>(kIoBytes);
  std::mutex mu;
  WriteFailure first;
  for_each_index(pieces, static_cast<int>(buffers.count()), [&](int thread, int64_t i) {
    char* buf = buffers[static_cast<size_t>(thread)];
    const int64_t offset = begin + i * static_cast<int64_t>(kIoBytes);
    const size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(kIoBytes), end - offset));
    runs.gather(offset - base, n, buf);
    const WriteFailure f = pwrite_all(fd, buf, n, offset);
    if (!f.failed()) return true;
    std::lock_guard<std::mutex> lock(mu);
    if (!first.failed()) first = f;
    return false;
  });
  return first;
}

}  // namespace

WrittenFile overwrite_file(const std::string& path, std::vector<PlacedBytes> pieces, int64_t piece_bytes) {
  return overwrite_file_in_groups(
      path, 1, [&pieces](int64_t) { return std::move(pieces); }, [](int64_t) {}, piece_bytes);
}

WrittenFile overwrite_file_in_groups(const std::string& path, int64_t groups,
                                     const std::function<std::vector<PlacedBytes>(int64_t)>& acquire,
                                     const std::function<void(int64_t)>& release, int64_t piece_bytes) {
  ST_CHECK(piece_bytes > 0, path, ": digest piece size ", piece_bytes);
  ST_CHECK(groups >= 1, path, ": ", groups, " groups of pieces");
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (fd.get() < 0) ST_FAULT("cannot open ", path, " to write it: ", errno_text());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) ST_FAULT("cannot stat ", path, ": ", errno_text());
  const int64_t total = static_cast<int64_t>(st.st_size);
  // The blocks are reserved in one call first, so that the file system lays them out in order: concurrent writes
  // into holes would allocate each 16 MiB piece where its write lands first, and the file would be read back in
  // scattered extents. A full disk shows here, before anything is written. File systems without fallocate
  // (EOPNOTSUPP) just skip it.
  if (total > 0) {
    int err = 0;
    do {
      err = ::fallocate(fd.get(), 0, 0, total) == 0 ? 0 : errno;
    } while (err == EINTR);
    if (err != 0 && err != EOPNOTSUPP)
      ST_FAULT("cannot write ", path, ": ", errno_text(err), " (reserving its ", total, " bytes)");
  }

  const IoBuffers buffers(kWritesInFlight,
                          static_cast<size_t>(std::min<int64_t>(
                              static_cast<int64_t>(kIoBytes),
                              (total + static_cast<int64_t>(kDirectAlign) - 1) / kDirectAlign * kDirectAlign)));
  UniqueFd direct(::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC));
  // Else the file system refuses O_DIRECT (tmpfs before Linux 6.6: EINVAL), and everything goes through the page cache.
  bool use_direct = direct.get() >= 0;
  const int64_t aligned_total = total / static_cast<int64_t>(kDirectAlign) * static_cast<int64_t>(kDirectAlign);
  // File bytes [begin, end) of `runs` (which start at begin): the aligned part direct, the last partial block, if any,
  // through the page cache. A file system that opened O_DIRECT but refuses its writes (EINVAL) gets this section
  // again, and the rest, through the page cache.
  auto write_section = [&](const Runs& runs, int64_t begin, int64_t end) {
    if (use_direct) {
      const int64_t direct_end = std::min(end, aligned_total);
      WriteFailure f = write_pieces(direct.get(), runs, begin, begin, direct_end, buffers);
      if (f.err != EINVAL) {
        if (!f.failed() && direct_end < end) f = write_pieces(fd.get(), runs, begin, direct_end, end, buffers);
        return f;
      }
      use_direct = false;
    }
    return write_pieces(fd.get(), runs, begin, begin, end, buffers);
  };

  // Group by group, the file is written and hashed up to the last multiple of `step` the group's bytes reach (whole
  // digest pieces, aligned for O_DIRECT); the bytes after it are copied into `carry` before the group is released,
  // and go out with the next group's.
  const int64_t step = std::lcm(piece_bytes, static_cast<int64_t>(kDirectAlign));
  std::vector<file_io_internal::Digest> digests;
  int64_t done = 0;  // file bytes [0, done) are written and hashed
  int64_t at = 0;    // the end of the pieces placed so far; file bytes [done, at) are in carry
  std::string carry;
  WriteFailure failure;
  for (int64_t g = 0; g < groups && !failure.failed(); ++g) {
    std::vector<PlacedBytes> pieces = acquire(g);
    struct Release {
      const std::function<void(int64_t)>& release;
      int64_t g;
      ~Release() { release(g); }
    } release_group{release, g};
    // The file's bytes from `done` as runs of memory: the carry, each piece, and between them the bytes the file
    // already holds.
    pieces.erase(std::remove_if(pieces.begin(), pieces.end(), [](const PlacedBytes& p) { return p.bytes == 0; }),
                 pieces.end());
    std::sort(pieces.begin(), pieces.end(),
              [](const PlacedBytes& a, const PlacedBytes& b) { return a.offset < b.offset; });
    std::vector<std::string> kept;
    kept.reserve(pieces.size() + 1);  // no reallocation: the runs point into these strings
    Runs runs;
    runs.add(carry.data(), static_cast<int64_t>(carry.size()));
    auto keep_until = [&](int64_t end) {
      if (end <= at) return;
      kept.emplace_back(static_cast<size_t>(end - at), '\0');
      pread_exact(fd.get(), path, kept.back().data(), kept.back().size(), at);
      runs.add(kept.back().data(), end - at);
    };
    for (const PlacedBytes& p : pieces) {
      ST_CHECK(p.bytes > 0 && p.offset >= at && p.offset <= total - p.bytes && p.data != nullptr, path, ": ", p.bytes,
               " bytes at ", p.offset, " overlap the previous piece (ending at ", at, ") or pass the end of the ",
               total, "-byte file");
      keep_until(p.offset);
      runs.add(p.data, p.bytes);
      at = p.offset + p.bytes;
    }
    const bool last = g + 1 == groups;
    if (last) keep_until(total);
    const int64_t end = last ? total : std::max(done, at / step * step);
    if (end > done) {
      Runs section;
      runs.for_each_span(0, end - done,
                         [&section](const char* p, size_t n) { section.add(p, static_cast<int64_t>(n)); });
      // The digest is computed beside the writes, from the same bytes in memory.
      BackgroundDigest digest(section, piece_bytes);
      failure = write_section(section, done, end);
      if (failure.failed()) break;
      const std::vector<file_io_internal::Digest> d = digest.result();
      digests.insert(digests.end(), d.begin(), d.end());
    }
    std::string next(static_cast<size_t>(std::max<int64_t>(at - end, 0)), '\0');
    runs.gather(end - done, next.size(), next.data());
    carry.swap(next);
    done = end;
    at = std::max(at, end);
  }
  if (direct.get() >= 0 && direct.close() != 0 && !failure.failed()) failure = {errno, total};
  if (failure.failed())
    ST_FAULT("cannot write ", path, ": ", errno_text(failure.err), " (at byte ", failure.offset, " of ", total, ")");
  // Durable before the caller commits it: data, length and the device's cache.
  while (::fsync(fd.get()) != 0) {
    if (errno != EINTR) ST_FAULT("fsync of ", path, " failed: ", errno_text());
  }
  if (fd.close() != 0) ST_FAULT("close of ", path, " after writing failed: ", errno_text());
  return {total, file_io_internal::root_of(digests)};
}

}  // namespace st
