#include "shardtrain/core/small_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/core/unique_fd.h"

namespace st {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (a named pipe, or a pipe such as <(...))";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "of an unknown kind";
}

std::string read_small_file(const std::string& path, const SmallFile& f) {
  const std::string limit = format_mib(f.max_bytes) + " limit for " + f.kind;
  // stat(2) first: a FIFO must be refused before open(2), which would wait for a writer.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) ST_BAD_INPUT(f.shown, " does not exist");
    ST_BAD_INPUT(f.shown, " cannot be read: ", errno_text());
  }
  if (!S_ISREG(st.st_mode))
    ST_BAD_INPUT(f.shown, " is ", file_kind(st.st_mode), ", not a regular file ", f.not_regular);
  if (st.st_size > f.max_bytes)
    ST_BAD_INPUT(f.shown, " is ", st.st_size, " bytes",
                 st.st_size >= (int64_t{1} << 30) ? " (" + format_gib(st.st_size) + ")" : std::string(), ", over the ",
                 limit);
  // O_NONBLOCK: should the path have become a FIFO since the stat, open(2) must still not wait for a writer.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (!fd) ST_BAD_INPUT(f.shown, " cannot be opened: ", errno_text());
  std::string text;
  int err = 0;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    err = EINVAL;
  } else {
    // Room for the size stat(2) gave and one byte more: a file that fills it grew since, and is read on up to one
    // byte past the limit, to tell one that grew past it from one that is exactly at it.
    const auto most = static_cast<size_t>(f.max_bytes) + 1;
    text.resize(std::min(static_cast<size_t>(st.st_size) + 1, most));
    size_t got = 0;
    for (;;) {
      if (got == text.size()) {
        if (text.size() == most) break;
        text.resize(most);
      }
      const ssize_t r = ::read(fd.get(), text.data() + got, text.size() - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) err = errno;
      if (r <= 0) break;
      got += static_cast<size_t>(r);
    }
    text.resize(got);
  }
  fd.reset();
  if (err == EINVAL) ST_BAD_INPUT(f.shown, " changed while it was opened (it is no longer a regular file)");
  if (err != 0) ST_BAD_INPUT(f.shown, " cannot be read: ", errno_text(err));
  if (static_cast<int64_t>(text.size()) > f.max_bytes)
    ST_BAD_INPUT(f.shown, " grew past the ", limit, " while it was read");
  return text;
}

}  // namespace st
