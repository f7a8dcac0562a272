#include "shardtrain/core/new_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "shardtrain/core/error.h"

namespace st {

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

void refuse_existing(const std::string& path, const std::string& what) {
  if (path_exists(path))
    ST_BAD_INPUT(what, " ", path, ": exists; shardtrain writes only new files: remove it, or name another path");
}

int rename_no_replace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  const int err = errno;
  // EINVAL: this file system does not take the flag (some network and FUSE file systems); ENOSYS: nor the kernel.
  if (err != EINVAL && err != ENOSYS && err != ENOTSUP) return err;
  struct stat st {};
  if (::lstat(from.c_str(), &st) != 0) return errno;
  if (S_ISDIR(st.st_mode)) {
    // A directory cannot be linked: check, then rename (over an empty directory made in between, rename replaces it).
    if (path_exists(to)) return EEXIST;
    return std::rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
  }
  if (::link(from.c_str(), to.c_str()) != 0) return errno;  // EEXIST if `to` exists
  if (::unlink(from.c_str()) != 0) return errno;
  return 0;
}

}  // namespace st
