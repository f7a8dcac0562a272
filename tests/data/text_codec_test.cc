// The byte codec: each byte its own id, text printed as is and other bytes as \xNN; no codec for other vocabularies.
#include "shardtrain/data/text_codec.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "shardtrain/core/error.h"

namespace st {
namespace {

TEST(TextCodec, BytesAreTheirOwnIds) {
  const std::unique_ptr<TextCodec> codec = text_codec(256);
  ASSERT_NE(codec, nullptr);
  const std::string text = std::string("Hi\n\t\0", 5) + "\xc3\xa9\xff";
  EXPECT_EQ(codec->encode(text), (std::vector<int32_t>{72, 105, 10, 9, 0, 195, 169, 255}));
  EXPECT_EQ(codec->decode(codec->encode(text)), "Hi\n\t\\x00\\xc3\\xa9\\xff");
  EXPECT_EQ(codec->decode({32, 126, 127, 31}), " ~\\x7f\\x1f");
  EXPECT_TRUE(codec->encode("").empty());
  EXPECT_THROW(codec->decode({256}), Error);
}

// A byte is a whole character of the byte codec's text: each token's text comes out at once.
TEST(TextCodec, ByteStreamPrintsEachTokenAtOnce) {
  const std::unique_ptr<TextCodec> codec = text_codec(256);
  const std::unique_ptr<TextStream> s = codec->stream();
  const std::vector<int32_t> ids = {72, 195, 169, 10, 0};
  std::string joined;
  for (int32_t id : ids) {
    const std::string piece = s->push(id);
    EXPECT_EQ(piece, codec->decode({id}));
    joined += piece;
  }
  EXPECT_EQ(s->finish(), "");
  EXPECT_EQ(joined, codec->decode(ids));
}

TEST(TextCodec, OtherVocabulariesNeedATokenizer) {
  EXPECT_EQ(text_codec(300), nullptr);
  EXPECT_EQ(text_codec(50257), nullptr);
  EXPECT_EQ(text_codec(255), nullptr);
}

}  // namespace
}  // namespace st
