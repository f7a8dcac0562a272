#include "shardtrain/data/text_source.h"

#include <gtest/gtest.h>

#include "data_test_util.h"

namespace st {
namespace {

using testing::bad_input_message;
using testing::contains;
using testing::read_all;
using testing::TempDir;
using testing::write_bytes;

TEST(TextSource, EveryByteIsATokenIncludingHighBytes) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), std::string("A\n\xff\x80\x00z", 6));
  auto src = open_text_source(dir.file("a.txt"), 256);
  EXPECT_EQ(src->vocab_size(), 256);
  EXPECT_EQ(read_all(*src), (std::vector<int32_t>{65, 10, 255, 128, 0, 122}));
  EXPECT_TRUE(contains(src->describe(), "1 file, 6 bytes")) << src->describe();
}

TEST(TextSource, GlobIsConcatenatedInSortedOrder) {
  TempDir dir;
  write_bytes(dir.file("part2.txt"), "cd");
  write_bytes(dir.file("part10.txt"), "b");
  write_bytes(dir.file("part1.txt"), "a");
  auto src = open_text_source(dir.file("part*.txt"), 50257);
  EXPECT_EQ(src->vocab_size(), 256);  // bytes, whatever the model's vocabulary
  std::vector<int32_t> got = read_all(*src);
  EXPECT_EQ(std::string(got.begin(), got.end()), "abcd");  // part1, part10, part2
  std::vector<int32_t> mid(2);
  src->read(1, 2, mid.data());  // across the part10 -> part2 boundary
  EXPECT_EQ(mid, (std::vector<int32_t>{'b', 'c'}));
}

TEST(TextSource, EmptyFileIsNamed) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "abc");
  write_bytes(dir.file("b.txt"), "");
  const std::string msg = bad_input_message([&] { open_text_source(dir.file("*.txt"), 256); });
  EXPECT_TRUE(contains(msg, dir.file("b.txt") + " is empty (0 bytes)")) << msg;
}

TEST(TextSource, VocabBelow256NamesModelVocabSize) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "abc");
  const std::string msg = bad_input_message([&] { open_text_source(dir.file("a.txt"), 255); });
  EXPECT_TRUE(contains(msg, "model.vocab_size >= 256, got 255")) << msg;
}

TEST(TextSource, GlobMatchingNothingNamesPattern) {
  TempDir dir;
  const std::string msg = bad_input_message([&] { open_text_source(dir.file("*.txt"), 256); });
  EXPECT_TRUE(contains(msg, "'" + dir.file("*.txt") + "' matches no file")) << msg;
}

}  // namespace
}  // namespace st
