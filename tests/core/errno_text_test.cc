#include "shardtrain/core/errno_text.h"

#include <fcntl.h>
#include <gtest/gtest.h>

#include <cerrno>

namespace st {
namespace {

TEST(ErrnoText, IsTheSystemsTextForTheValue) {
  EXPECT_EQ(errno_text(ENOENT), "No such file or directory");
  EXPECT_EQ(errno_text(ENOSPC), "No space left on device");
  EXPECT_EQ(errno_text_lower(ECONNREFUSED), "connection refused");
  EXPECT_EQ(errno_text_lower(ENOENT), "no such file or directory");
}

TEST(ErrnoText, DefaultsToErrnoWhereItIsCalled) {
  ASSERT_EQ(::open("/nonexistent-directory/x", O_RDONLY), -1);
  EXPECT_EQ(errno_text(), "No such file or directory");
  errno = EACCES;
  EXPECT_EQ(errno_text_lower(), "permission denied");
}

}  // namespace
}  // namespace st
