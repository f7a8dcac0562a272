#include "shardtrain/core/new_file.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <filesystem>
#include <string>

#include "../common/temp_dir.h"
#include "shardtrain/core/error.h"

namespace fs = std::filesystem;

namespace st {
namespace {

using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

TEST(NewFile, PathExistsSeesFilesDirectoriesAndDanglingLinks) {
  TempDir dir;
  EXPECT_FALSE(path_exists(dir.file("none")));
  write_bytes(dir.file("f"), "x");
  EXPECT_TRUE(path_exists(dir.file("f")));
  EXPECT_TRUE(path_exists(dir.str()));
  fs::create_symlink(dir.file("none"), dir.file("link"));
  EXPECT_TRUE(path_exists(dir.file("link")));  // a dangling link is something a rename would replace
}

TEST(NewFile, RefuseExistingNamesThePathAndTheSetting) {
  TempDir dir;
  refuse_existing(dir.file("new"), "plot --out");  // nothing there: no error
  write_bytes(dir.file("old"), "x");
  try {
    refuse_existing(dir.file("old"), "plot --out");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("plot --out " + dir.file("old") + ": exists"), std::string::npos) << e.what();
  }
}

// The rename never replaces: a file or a directory at the target stays, and so does the source.
TEST(NewFile, RenameNoReplaceKeepsWhatIsThere) {
  TempDir dir;
  write_bytes(dir.file("tmp"), "new");
  write_bytes(dir.file("target"), "theirs");
  EXPECT_EQ(rename_no_replace(dir.file("tmp"), dir.file("target")), EEXIST);
  EXPECT_EQ(read_bytes(dir.file("target")), "theirs");
  EXPECT_EQ(read_bytes(dir.file("tmp")), "new");
  fs::create_directory(dir.file("tdir"));
  fs::create_directory(dir.file("empty"));
  EXPECT_EQ(rename_no_replace(dir.file("tdir"), dir.file("empty")), EEXIST);  // not even an empty directory
  EXPECT_TRUE(fs::is_directory(dir.file("tdir")));
  EXPECT_EQ(rename_no_replace(dir.file("tmp"), dir.file("free")), 0);
  EXPECT_EQ(read_bytes(dir.file("free")), "new");
  EXPECT_FALSE(path_exists(dir.file("tmp")));
  EXPECT_EQ(rename_no_replace(dir.file("none"), dir.file("x")), ENOENT);
}

}  // namespace
}  // namespace st
