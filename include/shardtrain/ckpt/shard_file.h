// One rank's checkpoint file: a serial HDF5 file holding, for every unit, this rank's slices of the fp32
// master weights and the AdamW moments (see docs/checkpoint-format.md):
//
//   /                       attrs: format_version, rank, world_size, step
//   /units/<unit name>/     attrs: offset, count (the [offset, offset+count) of the unit's flat buffer)
//       param  [count] f32
//       exp_avg     [count] f32   (AdamW m)
//       exp_avg_sq  [count] f32   (AdamW v)
//
// Any world size reads exactly the elements it needs: a reader intersects its new span with the spans
// of the old files and reads those hyperslabs, opening only the files that hold them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardtrain/ckpt/file_read.h"
#include "shardtrain/ckpt/file_write.h"
#include "shardtrain/shard/shard_span.h"

namespace st {

enum class ShardState { kParam, kExpAvg, kExpAvgSq };
const char* dataset_name(ShardState s);  // "param", "exp_avg", "exp_avg_sq"

struct UnitSlice {
  std::string unit;  // unit name
  ShardSpan span;
  const float* param = nullptr;  // span.count elements each
  const float* exp_avg = nullptr;
  const float* exp_avg_sq = nullptr;
};

// Writes the file (truncating) and fsyncs it; returns its length and digest with kDigestPieceBytes (equal to
// file_size and file_digest of `path`), hashed from memory while the bytes were written, so that no second pass
// reads the file. HDF5 writes the structure (attributes, groups, the datasets' headers and their allocated,
// unfilled storage); the raw floats then go in with overwrite_file (file_write.h): large writes in file order.
// I/O failures (ENOSPC, EFBIG, EIO) are kFault naming the path and the OS's error text; a failed write
// leaves a partial file at `path`.
WrittenFile write_shard_file(const std::string& path, int rank, int world_size, int64_t step,
                             const std::vector<UnitSlice>& slices);

// Where the streamed write_shard_file finds each unit's floats: open(i) returns unit i's slice with its pointers
// valid until close(i) (e.g. a device backend's unit pulled into its host view, and released).
struct UnitSource {
  std::function<UnitSlice(size_t)> open;
  std::function<void(size_t)> close;
};

// write_shard_file for state that is not all in memory at once: `layout` gives each unit's name and span (its pointers
// are not read), and the floats come from `source`, one unit at a time: units are opened in order, each once, as the
// write reaches them (overwrite_file_in_groups), and each is closed before the next is opened, also when the write
// fails. The file, its length and digest are those write_shard_file writes for the same slices.
WrittenFile write_shard_file(const std::string& path, int rank, int world_size, int64_t step,
                             const std::vector<UnitSlice>& layout, const UnitSource& source);

// Elements [want.offset, want.end()) of a unit's state, to be read into out.
struct SliceRead {
  std::string unit;
  ShardState state = ShardState::kParam;
  ShardSpan want;
  float* out = nullptr;
};

// Reads slices of one rank file.
class ShardFileReader {
 public:
  explicit ShardFileReader(const std::string& path);  // kBadInput naming the path if not a valid file
  ShardFileReader(ShardFileReader&&) noexcept;
  ShardFileReader& operator=(ShardFileReader&&) noexcept;
  ~ShardFileReader();

  int rank() const;
  int world_size() const;
  int64_t step() const;
  ShardSpan span(const std::string& unit) const;  // kBadInput if the unit is absent
  // Reads elements [want.offset, want.end()) of the unit's state into out; `want` must lie inside span(unit).
  void read(const std::string& unit, ShardState state, const ShardSpan& want, float* out) const;
  // A load's one pass over the file (digest_and_read): reads every slice of `reads` whose dataset the file holds as
  // this machine's contiguous fp32, and returns the digest with piece_bytes of the bytes read. The caller compares
  // the digest before it uses what was read, and then reads the other slices with read() (stored_plain is false for
  // them: another type, or chunked). Each `want` is checked as read() checks it, before anything is read.
  std::string read_plain_and_digest(const std::vector<SliceRead>& reads, int64_t piece_bytes) const;
  // The file bytes of each slice of `reads` whose dataset is stored plain (those read_plain_and_digest reads), each
  // `want` checked as read() checks it: for a pass over the file that the caller runs (FilePassInParts).
  std::vector<WantedBytes> plain_bytes(const std::vector<SliceRead>& reads) const;
  bool stored_plain(const std::string& unit, ShardState state) const;
  // Whether every dataset of the file is stored plain.
  bool all_plain() const;
  const std::string& path() const;
  // The units this file holds, in the order they were written.
  const std::vector<std::string>& unit_names() const;
  bool has_unit(const std::string& unit) const;
  // Notes on the contract above:
  //  * The constructor checks the whole file: a format_version this build reads (check_format_version), 0 <= rank <
  //    world_size, and for every unit the offset/count attributes and three 1-D float datasets of `count`
  //    elements. A missing, truncated or garbage file is kBadInput naming the path (HDF5's error text follows).
  //  * read(): a `want` outside span(unit) is kBadInput naming the path, the unit and both ranges (it means the
  //    manifest and the file disagree); count 0 reads nothing. Only the wanted elements are read (a hyperslab).
  //  * Debian's libhdf5 is built thread-safe (H5_HAVE_THREADSAFE): readers may be used from several threads,
  //    but HDF5 runs every call under one global lock, so reads do not overlap.

 private:
  struct Impl;
  Impl* impl_ = nullptr;
};

}  // namespace st
