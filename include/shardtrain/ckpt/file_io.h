// Durable file operations for the checkpoint commit protocol. HDF5 never calls fsync itself, so the
// protocol does: a file's data, then its directory entry. Large checkpoint files are read by file_read.h, written by
// file_write.h and checked by the digests of digest.h.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace st {

// fsync(2) of a file or directory by path; kFault naming the path and errno text on failure.
void fsync_path(const std::string& path);
// Writes `text` to `path` via `path.tmp-<pid>`: write, fsync, rename, fsync the directory. Replaces what is at `path`:
// for the files a protocol owns (a checkpoint's manifest, ckpt.dir/latest).
void write_file_atomic(const std::string& path, const std::string& text);
// The same for a user-named output, which is never replaced (core/new_file.h): kBadInput naming `path` with `what`
// (e.g. "ckpt export --out") if it exists before the write or appears during it.
void write_new_file_atomic(const std::string& path, const std::string& text, const std::string& what);
// Gives the finished, fsynced file `tmp` the name `path` unless something is there (rename_no_replace), and fsyncs
// the directory. `tmp` is removed on failure: kBadInput naming `path` with `what` if it exists, kFault otherwise.
void commit_new_file(const std::string& tmp, const std::string& path, const std::string& what);
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

}  // namespace st
