#include "shardtrain/core/unique_fd.h"

#include <unistd.h>

#include <utility>

namespace st {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

void UniqueFd::reset() noexcept {
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

int UniqueFd::close() noexcept {
  if (fd_ < 0) return 0;
  return ::close(std::exchange(fd_, -1));
}

int UniqueFd::release() noexcept { return std::exchange(fd_, -1); }

}  // namespace st
