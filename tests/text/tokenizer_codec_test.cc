// The tokenizer's TextCodec streamed a token at a time (what generate prints): the pieces are decode() of all the
// tokens, and no piece ends inside a UTF-8 character, on a byte-level tokenizer whose ids are the bytes themselves, so
// that every way a token can cut a character is reached.
#include "shardtrain/text/tokenizer_codec.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "../common/byte_tokenizer.h"
#include "../common/temp_dir.h"
#include "shardtrain/core/rng.h"

namespace st {
namespace {

using testing::TempDir;

TokenizerCodec byte_codec(const TempDir& dir) {
  const std::string path = dir.file("tokenizer.json");
  testing::write_bytes(path, testing::byte_tokenizer_json({"<|endoftext|>"}).dump());
  return TokenizerCodec(Tokenizer::load(path));
}

std::vector<int32_t> bytes_of(const std::string& s) {
  std::vector<int32_t> ids;
  for (char c : s) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

// What each push returns, then finish().
std::vector<std::string> pieces(const TextCodec& codec, const std::vector<int32_t>& ids) {
  const std::unique_ptr<TextStream> s = codec.stream();
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(s->push(id));
  out.push_back(s->finish());
  return out;
}

TEST(TokenizerCodec, StreamHoldsAnUnfinishedCharacterUntilItCompletes) {
  TempDir dir;
  const TokenizerCodec codec = byte_codec(dir);
  // "a€" then U+1F600 (4 bytes), then the added token.
  EXPECT_EQ(pieces(codec, {'a', 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80, 256}),
            (std::vector<std::string>{"a", "", "", "\u20AC", "", "", "", "\U0001F600", "<|endoftext|>", ""}));
  // A character cut off by the end: finish() gives its one U+FFFD, as decode() does.
  EXPECT_EQ(pieces(codec, {'x', 0xE2, 0x82}), (std::vector<std::string>{"x", "", "", "\uFFFD"}));
  // What can never become a character is replaced at once: a lone continuation byte, E0 80 (overlong), C0.
  EXPECT_EQ(pieces(codec, {0x80, 0xE0, 0x80, 0xC0, 'b'}),
            (std::vector<std::string>{"\uFFFD", "", "\uFFFD\uFFFD", "\uFFFD", "b", ""}));
}

TEST(TokenizerCodec, StreamedPiecesAreTheDecodeOfAll) {
  TempDir dir;
  const TokenizerCodec codec = byte_codec(dir);
  // Bytes drawn mostly from valid characters of every length, with ill-formed ones among them.
  const std::vector<std::string> alphabet = {
      "a",    " ",    "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80", "\xED\x9F\xBF", "\xF4\x8F\xBF\xBF",
      "\x80", "\xC0", "\xE0\x80", "\xED\xA0\x80", "\xF0\x90",         "\xF5",         "\xFF"};
  for (uint64_t seq = 0; seq < 200; ++seq) {
    std::string text;
    for (uint64_t k = 0; k < 30; ++k) text += alphabet[random_bits_at(7, seq, k) % alphabet.size()];
    const std::vector<int32_t> ids = bytes_of(text);
    std::string joined;
    for (const std::string& p : pieces(codec, ids)) joined += p;
    ASSERT_EQ(joined, codec.decode(ids)) << "sequence " << seq;
  }
}

// The byte tokenizer's 257 ids in a model of 300 rows: an id the tokenizer lacks decodes to nothing, whole or
// streamed (Hugging Face's decode skips it), and does not cut a character it falls inside.
TEST(TokenizerCodec, IdsPastTheTokenizerDecodeToNothing) {
  TempDir dir;
  const TokenizerCodec codec = byte_codec(dir);
  EXPECT_EQ(codec.decode({'a', 269, 'b', 299, 256}), "ab<|endoftext|>");
  EXPECT_EQ(pieces(codec, {'a', 0xE2, 0x82, 269, 0xAC}), (std::vector<std::string>{"a", "", "", "", "\u20AC", ""}));
  EXPECT_EQ(codec.decode({0xE2, 0x82, 269, 0xAC}), "\u20AC");
  EXPECT_EQ(make_text_codec(dir.file("tokenizer.json"), 300, "data.tokenizer")->decode({'x', 257}), "x");
}

}  // namespace
}  // namespace st
