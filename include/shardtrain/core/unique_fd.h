// A POSIX file descriptor that closes itself: files, directories, sockets. Moves, does not copy.
//
//   UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
//   if (!fd) ST_BAD_INPUT("cannot read ", path, ": ", errno_text());
//   ::read(fd.get(), buf, n);                     // closed when fd goes out of scope
//
// The destructor ignores close(2)'s result. Where that result matters (after writing: NFS and some local file
// systems report deferred write errors only at close), call close() and check it.
#pragma once

namespace st {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}  // takes ownership of fd; a negative fd holds nothing
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }  // -1 when nothing is held
  explicit operator bool() const { return fd_ >= 0; }

  // Closes the descriptor now, if one is held, ignoring the result; holds nothing after.
  void reset() noexcept;
  // Closes the descriptor now and returns close(2)'s result (errno set on failure); holds nothing after, whatever
  // the result (Linux frees the descriptor even when close fails). 0 when nothing was held.
  int close() noexcept;
  // Gives up ownership: returns the descriptor (-1 if none), which the caller must close.
  int release() noexcept;

 private:
  int fd_ = -1;
};

}  // namespace st
