#include "shardtrain/core/unique_fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace st {
namespace {

// Whether `fd` names an open descriptor of this process.
bool is_open(int fd) { return ::fcntl(fd, F_GETFD) != -1 || errno != EBADF; }

UniqueFd open_null() { return UniqueFd(::open("/dev/null", O_RDONLY | O_CLOEXEC)); }

TEST(UniqueFd, ClosesWhenItGoesOutOfScope) {
  int raw = -1;
  {
    const UniqueFd fd = open_null();
    raw = fd.get();
    ASSERT_GE(raw, 0);
    EXPECT_TRUE(static_cast<bool>(fd));
    EXPECT_TRUE(is_open(raw));
  }
  EXPECT_FALSE(is_open(raw));
}

TEST(UniqueFd, MovesOwnershipAndClosesWhatItReplaces) {
  UniqueFd a = open_null();
  UniqueFd b = open_null();
  const int a_raw = a.get(), b_raw = b.get();
  b = std::move(a);
  EXPECT_EQ(a.get(), -1);
  EXPECT_FALSE(static_cast<bool>(a));
  EXPECT_EQ(b.get(), a_raw);
  EXPECT_FALSE(is_open(b_raw));  // the descriptor b held before
  EXPECT_TRUE(is_open(a_raw));
  UniqueFd c(std::move(b));
  EXPECT_EQ(c.get(), a_raw);
  EXPECT_EQ(b.get(), -1);
}

TEST(UniqueFd, CloseReportsItsResultAndLeavesNothingHeld) {
  UniqueFd fd = open_null();
  const int raw = fd.get();
  EXPECT_EQ(fd.close(), 0);
  EXPECT_EQ(fd.get(), -1);
  EXPECT_FALSE(is_open(raw));
  EXPECT_EQ(fd.close(), 0);  // nothing held: nothing to close
  UniqueFd empty;
  EXPECT_EQ(empty.get(), -1);
  EXPECT_EQ(empty.close(), 0);
}

TEST(UniqueFd, ReleaseHandsTheDescriptorBack) {
  int raw = -1;
  {
    UniqueFd fd = open_null();
    raw = fd.release();
    EXPECT_EQ(fd.get(), -1);
  }
  EXPECT_TRUE(is_open(raw));
  EXPECT_EQ(::close(raw), 0);
}

}  // namespace
}  // namespace st
