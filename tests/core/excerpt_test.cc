#include "shardtrain/core/excerpt.h"

#include <gtest/gtest.h>

#include <string>

namespace st {
namespace {

TEST(Excerpt, PrintableTextIsUnchanged) {
  EXPECT_EQ(excerpt("data/train_*.bin"), "data/train_*.bin");
  EXPECT_EQ(excerpt("a\\b"), "a\\b");
  EXPECT_EQ(excerpt(""), "");
}

TEST(Excerpt, ControlBytesAndInvalidUtf8AreEscaped) {
  EXPECT_EQ(excerpt(std::string("a\x1b[2J\tb\x7f\n", 9)), "a\\x1b[2J\\x09b\\x7f\\x0a");
  EXPECT_EQ(excerpt(std::string("x\0y", 3)), "x\\x00y");
  EXPECT_EQ(excerpt("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(excerpt("\xc3"), "\\xc3");                    // a lead byte without its continuation
  EXPECT_EQ(excerpt("\xc0\xaf"), "\\xc0\\xaf");           // an overlong '/'
  EXPECT_EQ(excerpt("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(excerpt("\xc2\x9b"), "\\xc2\\x9b");           // U+009B, the C1 control sequence introducer
}

TEST(Excerpt, ValidUtf8StaysWhole) {
  EXPECT_EQ(excerpt("donn\xc3\xa9"
                    "es/\xe6\x97\xa5\xe6\x9c\xac.bin"),
            "donn\xc3\xa9"
            "es/\xe6\x97\xa5\xe6\x9c\xac.bin");
  EXPECT_EQ(excerpt("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");
}

TEST(Excerpt, LongTextIsCutWithItsSize) {
  EXPECT_EQ(excerpt(std::string(80, 'a')), std::string(80, 'a'));
  EXPECT_EQ(excerpt(std::string(81, 'a')), std::string(80, 'a') + "... (81 bytes)");
  EXPECT_EQ(excerpt(std::string(10'000'000, 'a')), std::string(80, 'a') + "... (10000000 bytes)");
  // An escape is never split: 78 characters and then \x01 (4) would make 82.
  EXPECT_EQ(excerpt(std::string(78, 'a') + "\x01" + "b"), std::string(78, 'a') + "... (80 bytes)");
  EXPECT_EQ(excerpt("abcdef", 3), "abc... (6 bytes)");
}

}  // namespace
}  // namespace st
