// The tokenizer on small tokenizer.json files written here: what it refuses (naming the file and the field), BPE
// merges worked out by hand, ignore_merges, added tokens in both modes, lossy UTF-8, decode, and encode() from many
// threads. Identity with Hugging Face on the real GPT-2, Llama 3 and Qwen 2.5 files is tests/text/text.cmake's.
#include "shardtrain/text/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../common/byte_tokenizer.h"
#include "../common/temp_dir.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

using nlohmann::json;
using testing::spell;
using testing::TempDir;

// A byte-level BPE whose ids 0..255 are the bytes themselves, then:
//   256 "ab", 257 "bc", 258 "abc", 259 "abab", 260 "ca" (no merge makes it; ignore_merges finds it whole)
// with the merges, by rank: "b c", "a b", "a bc", "ab ab". GPT-2's pre-tokenizer, ByteLevel decoder.
json small_tokenizer() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[spell(static_cast<unsigned char>(b))] = b;
  vocab["ab"] = 256;
  vocab["bc"] = 257;
  vocab["abc"] = 258;
  vocab["abab"] = 259;
  vocab["ca"] = 260;
  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = json::array({{{"id", 261},
                                    {"content", "<|end|>"},
                                    {"single_word", false},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"normalized", false},
                                    {"special", true}}});
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", json::array({"b c", "a b", "a bc", "ab ab"})}};
  return j;
}

// Llama 3's pre-tokenizer: a Split on its regex, then ByteLevel without a regex.
json llama_pre_tokenizer(const std::string& regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           json::array(
               {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
}

std::string write_json(const TempDir& dir, const json& j, const std::string& name = "tokenizer.json") {
  const std::string path = dir.file(name);
  testing::write_bytes(path, j.dump());
  return path;
}

Tokenizer load(const TempDir& dir, const json& j) { return Tokenizer::load(write_json(dir, j)); }

// The message of the kBadInput that loading `j` throws ("" and a failure if it loads or throws another kind).
std::string refusal(const json& j) {
  TempDir dir;
  const std::string path = write_json(dir, j);
  try {
    Tokenizer::load(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << "the message does not name the file: " << what;
    return what;
  }
  ADD_FAILURE() << "loaded: " << j.dump().substr(0, 200);
  return "";
}

std::string contents(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(Tokenizer, MergesByRankLeftmostFirst) {
  TempDir dir;
  const Tokenizer tok = load(dir, small_tokenizer());
  // "abc": (b,c) has rank 0, before (a,b) at rank 1; then (a,bc) at rank 2.
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{258}));
  // "abab": (a,b) twice at rank 1, the left one first; then (ab,ab) at rank 3.
  EXPECT_EQ(tok.encode("abab"), (std::vector<int32_t>{259}));
  // "abcab": bc, then ab at the end (rank 1) before a+bc (rank 2); abc and ab do not merge.
  EXPECT_EQ(tok.encode("abcab"), (std::vector<int32_t>{258, 256}));
  // GPT-2's split: "abc", " abab" (the space is its own byte token, 32), "\n".
  EXPECT_EQ(tok.encode("abc abab\n"), (std::vector<int32_t>{258, 32, 259, 10}));
  // "ca" is in the vocab but no merge makes it (ignore_merges is off).
  EXPECT_EQ(tok.encode("ca"), (std::vector<int32_t>{'c', 'a'}));
  EXPECT_EQ(tok.encode(""), (std::vector<int32_t>{}));
  EXPECT_EQ(tok.encode(" "), (std::vector<int32_t>{32}));
}

TEST(Tokenizer, LongWordsMergeAsShortOnes) {
  TempDir dir;
  const Tokenizer tok = load(dir, small_tokenizer());
  // 10 x "ab" (20 bytes, merged by rescanning) and 33 x "ab" (66 bytes, merged through the heap): every (a,b) first,
  // then (ab,ab) pairs from the left, leaving one "ab" over when the count is odd.
  std::string ab10, ab33;
  for (int i = 0; i < 10; ++i) ab10 += "ab";
  for (int i = 0; i < 33; ++i) ab33 += "ab";
  EXPECT_EQ(tok.encode(ab10), std::vector<int32_t>(5, 259));
  std::vector<int32_t> expected(16, 259);
  expected.push_back(256);
  EXPECT_EQ(tok.encode(ab33), expected);
  // 3000 x "abc" in one word: each abc is b+c, then a+bc; abc+abc has no merge.
  std::string abc;
  for (int i = 0; i < 3000; ++i) abc += "abc";
  EXPECT_EQ(tok.encode(abc), std::vector<int32_t>(3000, 258));
}

TEST(Tokenizer, IgnoreMergesTakesWholeVocabWords) {
  TempDir dir;
  json j = small_tokenizer();
  j["model"]["ignore_merges"] = true;
  const Tokenizer tok = load(dir, j);
  EXPECT_EQ(tok.encode("ca"), (std::vector<int32_t>{260}));
  EXPECT_EQ(tok.encode("cab"), (std::vector<int32_t>{'c', 256}));  // not in the vocab: merged as usual
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{258}));
}

TEST(Tokenizer, AddedTokensOrOrdinaryText) {
  TempDir dir;
  const Tokenizer tok = load(dir, small_tokenizer());
  EXPECT_EQ(tok.encode("x<|end|>y"), (std::vector<int32_t>{'x', 261, 'y'}));
  EXPECT_EQ(tok.encode("x<|end|>y", /*added_tokens=*/true), tok.encode("x<|end|>y"));
  // Read as text, GPT-2's split gives "x", "<|", "end", "|>", "y".
  EXPECT_EQ(tok.encode("x<|end|>y", /*added_tokens=*/false),
            (std::vector<int32_t>{'x', '<', '|', 'e', 'n', 'd', '|', '>', 'y'}));
  EXPECT_EQ(tok.encode("<|end|><|end|><|end"), (std::vector<int32_t>{261, 261, '<', '|', 'e', 'n', 'd'}));
  std::vector<int32_t> out = {7};
  tok.encode_into("ab<|end|>", true, &out);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 256, 261}));
  EXPECT_EQ(tok.added_token_id("<|end|>"), 261);
  EXPECT_EQ(tok.token_id("<|end|>"), 261);
  EXPECT_EQ(tok.token_id("abab"), 259);
  EXPECT_EQ(tok.token_id(spell(' ')), 32);
  EXPECT_EQ(tok.token_id("zz"), std::nullopt);
  EXPECT_EQ(tok.vocab_size(), 262);
  try {
    tok.added_token_id("<|eot|>");
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("has no added token \"<|eot|>\" (its added tokens: <|end|>)"),
              std::string::npos)
        << e.what();
  }
}

TEST(Tokenizer, AddedTokenFlags) {
  TempDir dir;
  json j = small_tokenizer();
  const auto added = [](int id, const std::string& content, bool single_word, bool lstrip, bool rstrip) {
    return json{{"id", id},         {"content", content}, {"single_word", single_word},
                {"lstrip", lstrip}, {"rstrip", rstrip},   {"normalized", false},
                {"special", false}};
  };
  j["added_tokens"].push_back(added(262, "<L>", false, true, false));
  j["added_tokens"].push_back(added(263, "<R>", false, false, true));
  j["added_tokens"].push_back(added(258, "abc", true, false, false));  // in the vocab: it keeps its vocab id
  const Tokenizer tok = load(dir, j);
  EXPECT_EQ(tok.encode("x \t<L>y"), (std::vector<int32_t>{'x', 262, 'y'}));  // takes the white space before it
  EXPECT_EQ(tok.encode("x<R> \ny"), (std::vector<int32_t>{'x', 263, 'y'}));  // and after it
  EXPECT_EQ(tok.encode("x abc"), (std::vector<int32_t>{'x', 32, 258}));      // a word of its own: the token
  // Inside a word it is not the token; the match is still stepped over, and "xabcd" is then one piece for BPE.
  EXPECT_EQ(tok.encode("xabcd"), (std::vector<int32_t>{'x', 258, 'd'}));
}

TEST(Tokenizer, InvalidUtf8IsReplacedLikeFromUtf8Lossy) {
  TempDir dir;
  const Tokenizer tok = load(dir, small_tokenizer());
  // Each maximal invalid subpart is one U+FFFD (EF BF BD): a lone continuation byte, a truncated 3-byte sequence
  // (one replacement for both bytes), a surrogate (three: ED is not followed by 80..9F), 0xFF.
  const std::string bad = std::string("a\x80") + "b\xE2\x82" + "c\xED\xA0\x80" + "d\xFF";
  const std::string replaced = "a\uFFFDb\uFFFDc\uFFFD\uFFFD\uFFFDd\uFFFD";
  EXPECT_EQ(tok.encode(bad), tok.encode(replaced));
  EXPECT_EQ(tok.decode(tok.encode(bad)), replaced);
}

TEST(Tokenizer, Decode) {
  TempDir dir;
  const Tokenizer tok = load(dir, small_tokenizer());
  const std::string text = "abc abab\n<|end|> caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80!";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
  EXPECT_EQ(tok.decode(std::vector<int32_t>{258, 261, 32}), "abc<|end|> ");
  // Half of a character decodes to U+FFFD, as Hugging Face's from_utf8_lossy gives it.
  EXPECT_EQ(tok.decode(std::vector<int32_t>{'a', 0xE6, 0x97}), "a\uFFFD");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{}), "");
  for (const int32_t bad : {262, -1}) {
    try {
      tok.decode(std::vector<int32_t>{258, bad});
      ADD_FAILURE() << "decoded id " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      const std::string what = e.what();
      EXPECT_NE(what.find(tok.path()), std::string::npos) << what;
      EXPECT_NE(what.find("cannot decode id " + std::to_string(bad) + " at position 1: expected an id in 0..261"),
                std::string::npos)
          << what;
    }
  }
}

TEST(Tokenizer, NfcNormalizerComposesBeforeSplitting) {
  TempDir dir;
  json j = small_tokenizer();
  j["normalizer"] = {{"type", "NFC"}};
  j["pre_tokenizer"] = llama_pre_tokenizer(R"((?i:'s|'t)|\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
  const Tokenizer tok = load(dir, j);
  // "e" + U+0301 becomes U+00E9 (C3 A9), then the letters are one piece; the digits go by three.
  EXPECT_EQ(tok.encode("ae\xCC\x81"
                       "1234"),
            (std::vector<int32_t>{'a', 0xC3, 0xA9, '1', '2', '3', '4'}));
  EXPECT_EQ(tok.decode(tok.encode("e\xCC\x81")), "\xC3\xA9");
  // Text already in NFC comes back as it was.
  EXPECT_EQ(tok.decode(tok.encode("caf\xC3\xA9 'S")), "caf\xC3\xA9 'S");
}

TEST(Tokenizer, RefusesWhatItDoesNotImplement) {
  struct Case {
    std::string name;
    std::function<void(json&)> mutate;
    std::string expected;  // a part of the message
  };
  const std::vector<Case> cases = {
      {"WordPiece", [](json& j) { j["model"]["type"] = "WordPiece"; },
       "field model.type is \"WordPiece\", expected \"BPE\""},
      {"Unigram",
       [](json& j) {
         j["model"] = {{"type", "Unigram"}, {"vocab", json::array()}};
       },
       "field model.type is \"Unigram\", expected \"BPE\""},
      {"Lowercase",
       [](json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
       },
       "field normalizer.type is \"Lowercase\", expected \"NFC\" or normalizer null"},
      {"add_prefix_space", [](json& j) { j["pre_tokenizer"]["add_prefix_space"] = true; },
       "field pre_tokenizer.add_prefix_space is true, expected false"},
      {"invert",
       [](json& j) {
         j["pre_tokenizer"] = llama_pre_tokenizer("\\p{L}+");
         j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true;
       },
       "field pre_tokenizer.pretokenizers[0].invert is true, expected false"},
      {"Removed behaviour",
       [](json& j) {
         j["pre_tokenizer"] = llama_pre_tokenizer("\\p{L}+");
         j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
       },
       "field pre_tokenizer.pretokenizers[0].behavior is \"Removed\", expected \"Isolated\""},
      {"word class in the regex", [](json& j) { j["pre_tokenizer"] = llama_pre_tokenizer("\\w+|\\s+"); },
       "field pre_tokenizer.pretokenizers[0].pattern.Regex is \"\\w+|\\s+\": \\w at offset 0 means different "
       "things in Oniguruma"},
      {"bad regex", [](json& j) { j["pre_tokenizer"] = llama_pre_tokenizer("(\\p{L}+"); },
       "field pre_tokenizer.pretokenizers[0].pattern.Regex is \"(\\p{L}+\", which PCRE2 does not compile"},
      {"byte_fallback", [](json& j) { j["model"]["byte_fallback"] = true; },
       "field model.byte_fallback is true, expected false"},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, "field model.dropout is 0.1, expected null"},
      {"continuing_subword_prefix", [](json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
       "field model.continuing_subword_prefix is \"##\", expected null or \"\""},
      {"merge of a missing token", [](json& j) { j["model"]["merges"][0] = "b zz"; },
       "field model.merges[0] is \"b zz\": \"zz\" is not in model.vocab"},
      {"merge into a missing token",
       [](json& j) {
         j["model"]["merges"].push_back(json::array({"b", "a"}));
       },
       "field model.merges[4] is [\"b\",\"a\"]: \"ba\" is not in model.vocab"},
      {"merge of three",
       [](json& j) {
         j["model"]["merges"].push_back(json::array({"c", "a", "b"}));
       },
       "field model.merges[4] is [\"c\",\"a\",\"b\"], expected \"a b\" or [\"a\", \"b\"]"},
      {"vocab without a byte",
       [](json& j) {
         j["model"]["vocab"].erase(spell('z'));
         j["model"]["vocab"]["zz"] = 'z';
       },
       "field model.vocab has no entry \"z\" (byte 122), expected all 256 byte-level symbols"},
      {"vocab ids with a gap", [](json& j) { j["model"]["vocab"]["ca"] = 300; },
       "field model.vocab[ca] is 300, expected an id in 0..260"},
      {"vocab id twice", [](json& j) { j["model"]["vocab"]["ca"] = 259; },
       "field model.vocab[ca] is 259, which \"abab\" has too"},
      {"added token id collides", [](json& j) { j["added_tokens"][0]["id"] = 5; },
       "field added_tokens[0].id is 5 for \"<|end|>\", expected 261"},
      {"added token twice",
       [](json& j) {
         json t = j["added_tokens"][0];
         t["id"] = 262;
         j["added_tokens"].push_back(t);
       },
       "field added_tokens[1].content is \"<|end|>\", which added_tokens[0] has too"},
      {"no decoder", [](json& j) { j["decoder"] = nullptr; }, "field decoder is null, expected a JSON object"},
      {"unknown post-processor",
       [](json& j) {
         j["post_processor"] = {{"type", "Custom"}};
       },
       "field post_processor.type is \"Custom\""},
  };
  for (const Case& c : cases) {
    json j = small_tokenizer();
    c.mutate(j);
    const std::string what = refusal(j);
    EXPECT_NE(what.find(c.expected), std::string::npos) << c.name << ": " << what;
  }
}

TEST(Tokenizer, RefusesFilesThatAreNotTokenizers) {
  TempDir dir;
  try {
    Tokenizer::load(dir.file("missing.json"));
    ADD_FAILURE() << "loaded a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("tokenizer file " + dir.file("missing.json") + " does not exist"),
              std::string::npos)
        << e.what();
  }
  testing::write_bytes(dir.file("broken.json"), "{\"model\": ");
  try {
    Tokenizer::load(dir.file("broken.json"));
    ADD_FAILURE() << "loaded broken JSON";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find(dir.file("broken.json") + " is not valid JSON"), std::string::npos)
        << e.what();
  }
}

// A tokenizer with merges of a space with each lowercase letter, of every pair of lowercase letters (ranked by the
// pair's letters) and of each pair with a vowel second with a following letter, so that real text merges in many
// ways.
json letter_tokenizer() {
  json j = small_tokenizer();
  json& vocab = j["model"]["vocab"];
  json merges = json::array();
  int id = 261;
  for (char a = 'a'; a <= 'z'; ++a) {
    vocab[spell(' ') + a] = id++;
    merges.push_back(spell(' ') + " " + a);
  }
  for (char a = 'a'; a <= 'z'; ++a) {
    for (char b = 'a'; b <= 'z'; ++b) {
      const std::string ab = {a, b};
      if (!vocab.contains(ab)) vocab[ab] = id++;
      merges.push_back(std::string(1, a) + " " + b);
    }
  }
  for (char a = 'a'; a <= 'z'; ++a) {
    for (char b : std::string("aeiou")) {
      for (char c = 'a'; c <= 'z'; ++c) {
        const std::string abc = {a, b, c};
        if (!vocab.contains(abc)) vocab[abc] = id++;
        merges.push_back(std::string{a, b} + " " + c);
      }
    }
  }
  j["model"]["merges"] = merges;
  j["added_tokens"][0]["id"] = id;
  return j;
}

TEST(Tokenizer, ThreadsGiveTheSingleThreadIds) {
  TempDir dir;
  const Tokenizer tok = load(dir, letter_tokenizer());
  const std::string text = contents("/usr/share/common-licenses/GPL-3");
  ASSERT_GT(text.size(), 30000u) << "/usr/share/common-licenses/GPL-3 (Debian's base-files) is missing";
  const std::vector<int32_t> expected = tok.encode(text);
  ASSERT_EQ(tok.decode(expected), text);
  ASSERT_LT(expected.size(), text.size() * 2 / 3) << "the letter merges should shorten the text";
  constexpr int kThreads = 4;
  std::vector<std::vector<int32_t>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 3; ++round) {  // the later rounds read the thread's word cache
        got[t].clear();
        tok.encode_into(text, true, &got[t]);
        if (got[t] != expected) return;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(got[t], expected) << "thread " << t;
}

TEST(Tokenizer, WordCacheTurnoverKeepsTheIds) {
  TempDir dir;
  const Tokenizer tok = load(dir, letter_tokenizer());
  // 100000 distinct words, more than a thread's word cache holds: the second pass reads a cache that has been
  // emptied and refilled, and must give what a thread with a fresh cache gives.
  std::string text;
  uint64_t x = 88172645463325252ull;
  for (int w = 0; w < 100000; ++w) {
    const int len = 2 + w % 9;
    for (int i = 0; i < len; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      text += static_cast<char>('a' + x % 26);
    }
    text += ' ';
  }
  const std::vector<int32_t> first = tok.encode(text);
  const std::vector<int32_t> second = tok.encode(text);
  std::vector<int32_t> fresh;
  std::thread([&] { fresh = tok.encode(text); }).join();
  EXPECT_EQ(first, fresh);
  EXPECT_EQ(second, fresh);
  EXPECT_EQ(tok.decode(first), text);
}

}  // namespace
}  // namespace st
