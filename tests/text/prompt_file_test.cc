// The prompts file of `generate --prompts`: text lines and JSONL lines of each kind read in order, blank lines
// skipped, CRLF lines; and each refusal with its exact message, naming FILE:LINE and the field.
#include "shardtrain/text/prompt_file.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../common/temp_dir.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

using testing::TempDir;

// The prompts of a file named `name` holding `text`, for a vocabulary of 300.
std::vector<PromptLine> read(const TempDir& dir, const std::string& name, const std::string& text) {
  testing::write_bytes(dir.file(name), text);
  return read_prompt_file(dir.file(name), 300);
}

// The message of read()'s refusal after its process prefix ("[host] "), with the directory written as DIR; "" when
// there is none.
std::string refusal(const TempDir& dir, const std::string& name, const std::string& text) {
  try {
    read(dir, name, text);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBadInput) << e.what();
    std::string m = e.what();
    m.erase(0, m.find("] ") + 2);
    for (size_t at; (at = m.find(dir.str())) != std::string::npos;) m.replace(at, dir.str().size(), "DIR");
    return m;
  }
  return "";
}

TEST(PromptFile, TextLinesArePromptsInOrderBlankLinesSkipped) {
  TempDir dir;
  const std::vector<PromptLine> p = read(dir, "p.txt", "first line\n\n  \t\nsecond\r\n third {\"prompt\": 1}");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].text, "first line");
  EXPECT_EQ(p[1].text, "second");  // CRLF: the \r is not part of it
  EXPECT_EQ(p[2].text, " third {\"prompt\": 1}");
  for (const PromptLine& l : p) EXPECT_EQ(l.kind, PromptLine::Kind::kText);
  EXPECT_EQ(p[0].where, dir.file("p.txt") + ":1");
  EXPECT_EQ(p[1].where, dir.file("p.txt") + ":4");
  EXPECT_EQ(p[2].where, dir.file("p.txt") + ":5");
  EXPECT_FALSE(is_jsonl_prompt_file("p.txt"));
  EXPECT_FALSE(is_jsonl_prompt_file("jsonl"));
  EXPECT_TRUE(is_jsonl_prompt_file("a/p.jsonl"));
  EXPECT_TRUE(is_jsonl_prompt_file("p.json"));
}

TEST(PromptFile, JsonlLinesHoldTextIdsOrAChat) {
  TempDir dir;
  const std::vector<PromptLine> p =
      read(dir, "p.jsonl",
           "{\"prompt\": \"two\\nlines\"}\n\n{\"prompt_ids\": [0, 5, 299]}\r\n"
           "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"content\": \"Hi\", \"role\": "
           "\"user\"}]}\n");
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].kind, PromptLine::Kind::kText);
  EXPECT_EQ(p[0].text, "two\nlines");
  EXPECT_EQ(p[1].kind, PromptLine::Kind::kIds);
  EXPECT_EQ(p[1].ids, (std::vector<int32_t>{0, 5, 299}));
  EXPECT_EQ(p[1].where, dir.file("p.jsonl") + ":3");
  EXPECT_EQ(p[2].kind, PromptLine::Kind::kChat);
  ASSERT_EQ(p[2].messages.size(), 2u);
  EXPECT_EQ(p[2].messages[0].role, "system");
  EXPECT_EQ(p[2].messages[0].content, "Be brief.");
  EXPECT_EQ(p[2].messages[1].role, "user");
  EXPECT_EQ(p[2].messages[1].content, "Hi");
}

TEST(PromptFile, EachRefusalNamesTheLineAndTheField) {
  TempDir dir;
  const std::string fields = "one of \"prompt\" (text), \"prompt_ids\" (token ids) or \"messages\" (a chat)";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"prompt\": \"a\",}",
       "DIR/p.jsonl:2: not a JSON object: [json.exception.parse_error.101] parse error at line 1, column 16: syntax "
       "error while parsing object key - unexpected '}'; expected string literal"},
      {"[1, 2]", "DIR/p.jsonl:2: expected a JSON object with " + fields + ", got a array"},
      {"{\"prompt\": \"a\", \"n\": 2}", "DIR/p.jsonl:2: unknown field \"n\": expected " + fields},
      {"{\"prompt\": \"a\", \"prompt_ids\": [1]}",
       "DIR/p.jsonl:2: both \"prompt\" and \"prompt_ids\": expected " + fields},
      {"{}", "DIR/p.jsonl:2: no prompt: expected " + fields},
      {"{\"prompt\": 7}", "DIR/p.jsonl:2: \"prompt\" is a number, expected a string"},
      {"{\"prompt\": \"\"}", "DIR/p.jsonl:2: \"prompt\" is empty: expected at least one byte of text"},
      {"{\"prompt_ids\": \"1,2\"}", "DIR/p.jsonl:2: \"prompt_ids\" is a string, expected an array of token ids"},
      {"{\"prompt_ids\": []}", "DIR/p.jsonl:2: \"prompt_ids\" is empty: expected at least one token id"},
      {"{\"prompt_ids\": [1, 300]}",
       "DIR/p.jsonl:2: prompt_ids[1] is 300, outside the model's vocabulary [0, 300) (model.vocab_size)"},
      {"{\"prompt_ids\": [-1]}",
       "DIR/p.jsonl:2: prompt_ids[0] is -1, outside the model's vocabulary [0, 300) (model.vocab_size)"},
      {"{\"prompt_ids\": [18446744073709551615]}",
       "DIR/p.jsonl:2: prompt_ids[0] is 18446744073709551615, outside the model's vocabulary [0, 300) "
       "(model.vocab_size)"},
      {"{\"prompt_ids\": [1.5]}", "DIR/p.jsonl:2: prompt_ids[0] is the number 1.5, expected a token id (an integer)"},
      {"{\"prompt_ids\": [\"1\"]}", "DIR/p.jsonl:2: prompt_ids[0] is a string, expected a token id (an integer)"},
      {"{\"messages\": {}}",
       "DIR/p.jsonl:2: \"messages\" is a object, expected an array of {\"role\": ..., \"content\": ...} objects"},
      {"{\"messages\": []}", "DIR/p.jsonl:2: \"messages\" is empty: expected at least one message"},
      {"{\"messages\": [\"hi\"]}",
       "DIR/p.jsonl:2: messages[0] is a string, expected a {\"role\": ..., \"content\": ...} object"},
      {"{\"messages\": [{\"role\": \"user\"}]}",
       "DIR/p.jsonl:2: messages[0] has no \"content\": expected \"role\" and \"content\""},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\", \"name\": \"b\"}]}",
       "DIR/p.jsonl:2: messages[0] has the field \"name\": expected \"role\" and \"content\" only"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": 1}]}",
       "DIR/p.jsonl:2: messages[0].content is a number, expected a string"}};
  for (const auto& [line, message] : cases)
    EXPECT_EQ(refusal(dir, "p.jsonl", "{\"prompt\": \"fine\"}\n" + line + "\n{\"prompt\": \"after\"}\n"), message)
        << line;
}

TEST(PromptFile, AFileWithoutAPromptIsRefused) {
  TempDir dir;
  EXPECT_EQ(refusal(dir, "p.txt", ""),
            "--prompts file DIR/p.txt holds no prompt (0 blank line(s)): expected one prompt a line");
  EXPECT_EQ(refusal(dir, "p.jsonl", "\n \r\n"),
            "--prompts file DIR/p.jsonl holds no prompt (2 blank line(s)): expected one prompt a line, each a JSON "
            "object with one of \"prompt\" (text), \"prompt_ids\" (token ids) or \"messages\" (a chat)");
  std::filesystem::remove(dir.file("none.txt"));
  try {
    read_prompt_file(dir.file("none.txt"), 300);
    FAIL() << "a missing file was read";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("--prompts file " + dir.file("none.txt")) != std::string::npos, true)
        << e.what();
  }
}

}  // namespace
}  // namespace st
