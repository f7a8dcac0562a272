#include "shardtrain/ckpt/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/new_file.h"
#include "shardtrain/core/unique_fd.h"

namespace st {
namespace {

std::string parent_dir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

}  // namespace

RemoveOnFailure::~RemoveOnFailure() {
  std::error_code ec;  // a destructor reports nothing: what cannot be removed stays
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

void check_output_dir(const std::string& path, const std::string& what) {
  const std::string dir = parent_dir(path);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) ST_BAD_INPUT(what, " ", path, ": output directory ", dir, " does not exist");
    // ENOTDIR: a component above dir is a file.
    ST_BAD_INPUT(what, " ", path, ": output directory ", dir, " cannot be used: ", errno_text(err));
  }
  if (!S_ISDIR(st.st_mode))
    ST_BAD_INPUT(what, " ", path, ": ", dir,
                 S_ISREG(st.st_mode) ? " is a file, not a directory" : " is not a directory");
}

void fsync_path(const std::string& path) {
  // O_RDONLY works for directories too; fsync on a read-only descriptor flushes the whole inode.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) ST_FAULT("cannot open ", path, " to fsync it: ", errno_text());
  while (::fsync(fd.get()) != 0) {
    if (errno != EINTR) ST_FAULT("fsync of ", path, " failed: ", errno_text());
  }
  if (fd.close() != 0) ST_FAULT("close of ", path, " after fsync failed: ", errno_text());
}

namespace {

// Writes `text` to a temporary beside `path`, fsynced, and returns its name; a failure removes it.
std::string write_temporary(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  RemoveOnFailure cleanup(tmp);
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) ST_FAULT("cannot create ", tmp, ": ", errno_text());
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ST_FAULT("write to ", tmp, " failed after ", done, " of ", text.size(), " bytes: ", errno_text());
    done += static_cast<size_t>(n);
  }
  while (::fsync(fd.get()) != 0) {
    if (errno != EINTR) ST_FAULT("fsync of ", tmp, " failed: ", errno_text());
  }
  if (fd.close() != 0) ST_FAULT("close of ", tmp, " failed: ", errno_text());
  cleanup.dismiss();
  return tmp;
}

}  // namespace

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = write_temporary(path, text);
  RemoveOnFailure cleanup(tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) ST_FAULT("cannot rename ", tmp, " to ", path, ": ", errno_text());
  cleanup.dismiss();
  // The rename is durable only once the directory entry is.
  fsync_path(parent_dir(path));
}

void write_new_file_atomic(const std::string& path, const std::string& text, const std::string& what) {
  refuse_existing(path, what);
  const std::string tmp = write_temporary(path, text);
  commit_new_file(tmp, path, what);
}

void commit_new_file(const std::string& tmp, const std::string& path, const std::string& what) {
  RemoveOnFailure cleanup(tmp);
  if (const int err = rename_no_replace(tmp, path)) {
    if (err == EEXIST)
      ST_BAD_INPUT(what, " ", path,
                   ": exists (it appeared while this was written; nothing was replaced): remove it, or name another "
                   "path");
    ST_FAULT("cannot rename ", tmp, " to ", path, ": ", errno_text(err));
  }
  cleanup.dismiss();
  fsync_path(parent_dir(path));
}

std::string read_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) ST_BAD_INPUT("cannot read ", path, ": ", errno_text());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) ST_BAD_INPUT("cannot stat ", path, ": ", errno_text());
  if (S_ISDIR(st.st_mode)) ST_BAD_INPUT("cannot read ", path, ": it is a directory");
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ST_BAD_INPUT("cannot read ", path, " after ", out.size(), " bytes: ", errno_text());
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

int64_t file_size(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t n = std::filesystem::file_size(path, ec);
  if (ec) ST_BAD_INPUT("cannot get the size of ", path, ": ", ec.message());
  return static_cast<int64_t>(n);
}
}  // namespace st
