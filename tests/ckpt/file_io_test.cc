#include "shardtrain/ckpt/file_io.h"

#include <gtest/gtest.h>

#include <string>

#include "ckpt_test_util.h"

namespace st {
namespace {

using testing::bad_input_message;
using testing::contains;
using testing::fault_message;
using testing::TempDir;
using testing::write_bytes;

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Sha256, FileOfOneMillionAMatchesTheNistVector) {
  TempDir dir;
  write_bytes(dir.file("a"), std::string(1000000, 'a'));
  EXPECT_EQ(sha256_file(dir.file("a")), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// The file is hashed in 1 MiB reads: sizes across and between chunk boundaries must agree with the one-shot hash.
TEST(Sha256, FileLargerThanOneChunkEqualsHashOfItsBytes) {
  TempDir dir;
  for (size_t size : {size_t{0}, size_t{1} << 20, (size_t{1} << 20) + 1, (size_t{3} << 20) + 12345}) {
    std::string bytes(size, '\0');
    uint32_t x = 12345;
    for (char& c : bytes) {
      x = x * 1664525u + 1013904223u;
      c = static_cast<char>(x >> 24);
    }
    const std::string path = dir.file("blob_" + std::to_string(size));
    write_bytes(path, bytes);
    EXPECT_EQ(sha256_file(path), sha256_hex(bytes.data(), bytes.size())) << size;
    EXPECT_EQ(file_size(path), static_cast<int64_t>(size));
  }
}

TEST(Sha256, MissingFileIsBadInputNamingThePath) {
  TempDir dir;
  const std::string msg = bad_input_message([&] { sha256_file(dir.file("absent.h5")); });
  EXPECT_TRUE(contains(msg, dir.file("absent.h5"))) << msg;
  EXPECT_TRUE(contains(msg, "No such file or directory")) << msg;
}

TEST(WriteFileAtomic, WritesReplacesAndLeavesNoTmpFile) {
  TempDir dir;
  const std::string path = dir.file("latest");
  write_file_atomic(path, "step_00000100\n");
  EXPECT_EQ(read_file(path), "step_00000100\n");
  write_file_atomic(path, std::string("step_2\0x", 8));  // shorter, with a NUL: fully replaced
  EXPECT_EQ(read_file(path), std::string("step_2\0x", 8));
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"latest"});
}

TEST(WriteFileAtomic, MissingDirectoryIsAFaultNamingThePathAndErrno) {
  TempDir dir;
  const std::string path = dir.file("no_such_dir/latest");
  const std::string msg = fault_message([&] { write_file_atomic(path, "x"); });
  EXPECT_TRUE(contains(msg, path + ".tmp-")) << msg;
  EXPECT_TRUE(contains(msg, "No such file or directory")) << msg;
  EXPECT_EQ(dir.entries(), std::vector<std::string>{});
}

TEST(ReadFile, MissingFileOrDirectoryIsBadInputNamingThePath) {
  TempDir dir;
  std::string msg = bad_input_message([&] { read_file(dir.file("manifest.json")); });
  EXPECT_TRUE(contains(msg, dir.file("manifest.json"))) << msg;
  EXPECT_TRUE(contains(msg, "No such file or directory")) << msg;
  msg = bad_input_message([&] { read_file(dir.str()); });
  EXPECT_TRUE(contains(msg, dir.str())) << msg;
  EXPECT_TRUE(contains(msg, "directory")) << msg;
}

TEST(FileSize, MissingFileIsBadInputNamingThePath) {
  TempDir dir;
  write_bytes(dir.file("seven"), "1234567");
  EXPECT_EQ(file_size(dir.file("seven")), 7);
  const std::string msg = bad_input_message([&] { file_size(dir.file("gone")); });
  EXPECT_TRUE(contains(msg, dir.file("gone"))) << msg;
}

TEST(FsyncPath, FilesAndDirectoriesSucceedMissingIsAFault) {
  TempDir dir;
  write_bytes(dir.file("f"), "x");
  EXPECT_NO_THROW(fsync_path(dir.file("f")));
  EXPECT_NO_THROW(fsync_path(dir.str()));
  const std::string msg = fault_message([&] { fsync_path(dir.file("gone")); });
  EXPECT_TRUE(contains(msg, dir.file("gone"))) << msg;
  EXPECT_TRUE(contains(msg, "No such file or directory")) << msg;
}

}  // namespace
}  // namespace st
