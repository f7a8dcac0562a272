// `shardtrain generate` with several prompts, stop strings and JSON lines, through the binary as a user runs it, on a
// byte-level GPT-2 file of random weights (--init.from): a --prompts file of text or JSONL prints, a line each and in
// the file's order, exactly the results of single --prompt and --prompt-ids runs of its lines; --stop cuts the text
// before the first stop string, streamed or not; --jsonl lines parse back to the results; and every bad prompt is
// refused with its exact message before anything is decoded.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../common/temp_dir.h"
#include "generate_cli_util.h"
#include "shardtrain/data/text_codec.h"

namespace st {
namespace {

using testing::CliResult;
using testing::generate_stdout;
using testing::json_lines;
using testing::parse_ids;
using testing::quoted;

constexpr const char* kSampling = " --temperature 0.9 --top-k 40 --seed 3 ";

// A result's text as a --prompts line prints it: backslash, newline and carriage return escaped.
std::string escaped(const std::string& text) {
  std::string out;
  for (const char c : text) out += c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r" : std::string(1, c);
  return out;
}

std::vector<int32_t> bytes_of(const std::string& s) {
  std::vector<int32_t> ids;
  for (const char c : s) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::string comma_ids(const std::vector<int32_t>& ids) {
  std::string out;
  for (const int32_t t : ids) out += (out.empty() ? "" : ",") + std::to_string(t);
  return out;
}

std::vector<std::string> lines_of(const std::string& output) {
  std::vector<std::string> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

class GenerateCli : public ::testing::Test {
 protected:
  void SetUp() override { model_ = testing::write_gpt_file(tmp_.file("byte.h5"), 256, 21); }

  // The stdout of `args` on the byte model; a failure when it does not exit 0.
  std::string run(const std::string& args) {
    const CliResult r = generate_stdout(model_, args);
    EXPECT_EQ(r.code, 0) << args << ": " << r.output;
    return r.output;
  }
  // The message and stdout of `args`, which must be refused with exit 2 before anything is decoded: no result on
  // stdout and no summary.
  std::string refused(const std::string& args) {
    const CliResult out = generate_stdout(model_, args);
    EXPECT_EQ(out.code, 2) << args << ": " << out.output;
    EXPECT_EQ(out.output, "") << args;
    const CliResult all =
        testing::run_shardtrain("generate --init.from " + model_.path + " " + model_.keys + " " + args);
    EXPECT_EQ(all.output.find("generate: "), std::string::npos) << all.output;
    const size_t at = all.output.find("] ");
    return at == std::string::npos ? all.output : all.output.substr(at + 2);
  }
  std::string write(const std::string& name, const std::string& text) {
    testing::write_bytes(tmp_.file(name), text);
    return tmp_.file(name);
  }

  testing::TempDir tmp_;
  testing::GptFile model_;
};

// Text lines (blank lines skipped, a CRLF line, a backslash) print, a line each in order, exactly what --prompt
// prints for each alone, escaped, however many are decoded together.
TEST_F(GenerateCli, TextPromptsPrintTheSinglePromptResultsInOrder) {
  const std::vector<std::string> prompts = {"The ", "Once upon a time", "a\\b", "x", "Q: why?\tA:", "zz top"};
  const std::string file = write("p.txt", prompts[0] + "\n\n" + prompts[1] + "\r\n" + prompts[2] + "\n   \n" +
                                              prompts[3] + "\n" + prompts[4] + "\n" + prompts[5]);
  const std::vector<std::string> got = lines_of(run("--prompts " + file + " --max-tokens 24" + kSampling));
  ASSERT_EQ(got.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string one = run("--prompt " + quoted(prompts[i]) + " --max-tokens 24" + kSampling);
    ASSERT_EQ(one.back(), '\n');
    EXPECT_EQ(got[i], escaped(one.substr(0, one.size() - 1))) << "prompt " << i;
  }
  // The results differ: each line is its own prompt's.
  EXPECT_NE(got[0], got[1]);
  // All six decoded together (the default --batch 16), in groups of four and two, or one at a time: the same lines.
  for (const char* batch : {" --batch 4", " --batch 1"})
    EXPECT_EQ(lines_of(run("--prompts " + file + " --max-tokens 24" + kSampling + batch)), got) << batch;
}

// JSONL of each kind: "prompt" (with a newline), "prompt_ids", "messages" is tested with a chat template in
// generate_chat_test.cc. --jsonl lines parse back: index in order, the single runs' ids, the text they decode to,
// finish_reason length and the prompt's ids.
TEST_F(GenerateCli, JsonlPromptsPrintTheSingleRunsAsJsonLines) {
  const std::string file = write("p.jsonl",
                                 "{\"prompt\": \"two\\nlines\"}\n\n{\"prompt_ids\": [84, 104, 101, 32]}\n"
                                 "{\"prompt\": \"Once\"}\r\n{\"prompt_ids\": [0, 255]}\n");
  const std::vector<std::vector<int32_t>> prompt_ids = {
      bytes_of("two\nlines"), {84, 104, 101, 32}, bytes_of("Once"), {0, 255}};
  const std::vector<nlohmann::json> got = json_lines(run("--prompts " + file + " --jsonl --max-tokens 20" + kSampling));
  ASSERT_EQ(got.size(), prompt_ids.size());
  const ByteCodec bytes;
  std::vector<std::string> texts;
  for (size_t i = 0; i < prompt_ids.size(); ++i) {
    const std::vector<int32_t> want =
        parse_ids(run("--prompt-ids " + comma_ids(prompt_ids[i]) + " --max-tokens 20" + kSampling));
    ASSERT_EQ(want.size(), 20u);
    const nlohmann::json& j = got[i];
    EXPECT_EQ(j.size(), 5u) << j;
    EXPECT_EQ(j.at("index"), i);
    EXPECT_EQ(j.at("token_ids").get<std::vector<int32_t>>(), want) << "prompt " << i;
    EXPECT_EQ(j.at("text"), bytes.decode(want)) << "prompt " << i;
    EXPECT_EQ(j.at("finish_reason"), "length");
    EXPECT_EQ(j.at("prompt_token_ids").get<std::vector<int32_t>>(), prompt_ids[i]);
    texts.push_back(j.at("text"));
  }
  // The same file without --jsonl: the texts, escaped, a line each.
  const std::vector<std::string> plain = lines_of(run("--prompts " + file + " --max-tokens 20" + kSampling));
  ASSERT_EQ(plain.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(plain[i], escaped(texts[i])) << "prompt " << i;

  // A file of ids only reads no tokenizer: ids a line, or "text" null.
  const std::string ids = write("ids.jsonl", "{\"prompt_ids\": [84, 104, 101, 32]}\n{\"prompt_ids\": [0, 255]}\n");
  const std::vector<std::string> id_lines = lines_of(run("--prompts " + ids + " --max-tokens 20" + kSampling));
  ASSERT_EQ(id_lines.size(), 2u);
  EXPECT_EQ(parse_ids(id_lines[0]), got[1].at("token_ids").get<std::vector<int32_t>>());
  EXPECT_EQ(parse_ids(id_lines[1]), got[3].at("token_ids").get<std::vector<int32_t>>());
  const std::vector<nlohmann::json> id_json =
      json_lines(run("--prompts " + ids + " --jsonl --max-tokens 20" + kSampling));
  ASSERT_EQ(id_json.size(), 2u);
  EXPECT_TRUE(id_json[0].at("text").is_null());
  EXPECT_EQ(id_json[1].at("token_ids"), got[3].at("token_ids"));
}

// One prompt with --jsonl: one line at the end; ids out (--prompt-ids) end with a newline.
TEST_F(GenerateCli, OnePromptWithJsonlIsOneLine) {
  const std::string streamed = run("--prompt 'The ' --max-tokens 16" + std::string(kSampling));
  const std::string line = run("--prompt 'The ' --max-tokens 16 --jsonl" + std::string(kSampling));
  ASSERT_EQ(lines_of(line).size(), 1u);
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j.at("index"), 0);
  EXPECT_EQ(j.at("text").get<std::string>() + "\n", streamed);
  EXPECT_EQ(j.at("prompt_token_ids").get<std::vector<int32_t>>(), bytes_of("The "));
  const std::string ids = run("--prompt-ids 84,104,101,32 --max-tokens 16" + std::string(kSampling));
  EXPECT_EQ(ids, comma_ids(j.at("token_ids").get<std::vector<int32_t>>()) + "\n");
}

// --stop: the text ends before the first occurrence of any stop string, streamed (what could start one held back)
// or as a result; the ids end with the token that completed it; finish_reason stop.
TEST_F(GenerateCli, StopStringsEndTheTextBeforeThem) {
  const std::string flags = " --max-tokens 60" + std::string(kSampling);
  const nlohmann::json whole = nlohmann::json::parse(run("--prompt 'The ' --jsonl" + flags));
  const std::string text = whole.at("text");
  const std::vector<int32_t> ids = whole.at("token_ids");
  ASSERT_EQ(ids.size(), 60u);
  const ByteCodec bytes;
  // The ids up to the token whose text completes `stop`.
  const auto ids_through = [&](const std::string& stop) {
    for (size_t k = 1; k <= ids.size(); ++k)
      if (bytes.decode(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(k))).find(stop) !=
          std::string::npos)
        return std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<ptrdiff_t>(k));
    return ids;
  };
  const std::string late = text.substr(40, 3), early = text.substr(12, 2);
  const size_t late_at = text.find(late), early_at = text.find(early);
  ASSERT_LE(early_at, 12u);
  ASSERT_LT(early_at, late_at);
  struct Stops {
    std::string flags, first;  // the --stop flags, and the one that occurs first
  };
  for (const Stops& s :
       {Stops{" --stop " + quoted(late), late}, Stops{" --stop " + quoted(late) + " --stop " + quoted(early), early}}) {
    const size_t at = text.find(s.first);
    const nlohmann::json j = nlohmann::json::parse(run("--prompt 'The ' --jsonl" + s.flags + flags));
    EXPECT_EQ(j.at("text"), text.substr(0, at)) << s.flags;
    EXPECT_EQ(j.at("token_ids").get<std::vector<int32_t>>(), ids_through(s.first)) << s.flags;
    EXPECT_EQ(j.at("finish_reason"), "stop");
    // Streamed: the same text, then the newline.
    EXPECT_EQ(run("--prompt 'The '" + s.flags + flags), text.substr(0, at) + "\n") << s.flags;
  }
  // A stop string that never comes: the whole text, finish_reason length.
  const nlohmann::json none = nlohmann::json::parse(run("--prompt 'The ' --jsonl --stop 'never in 60 bytes'" + flags));
  EXPECT_EQ(none.at("text"), text);
  EXPECT_EQ(none.at("finish_reason"), "length");
  // In a batch each result is cut at its own first stop, the others' whole.
  const std::string file = write("p.txt", "The \nOnce\n");
  const std::vector<nlohmann::json> batch =
      json_lines(run("--prompts " + file + " --jsonl --stop " + quoted(early) + flags));
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].at("text"), text.substr(0, early_at));
  const nlohmann::json once = nlohmann::json::parse(run("--prompt Once --jsonl --stop " + quoted(early) + flags));
  EXPECT_EQ(batch[1].at("text"), once.at("text"));
  EXPECT_EQ(batch[1].at("finish_reason"), once.at("finish_reason"));
}

TEST_F(GenerateCli, BadPromptsAreRefusedBeforeDecoding) {
  const std::string fields = "one of \"prompt\" (text), \"prompt_ids\" (token ids) or \"messages\" (a chat)";
  const std::string good = "{\"prompt\": \"fine\"}\n";
  struct Case {
    std::string args, message;
  };
  const std::string bad_json = write("bad.jsonl", good + "{\"prompt\": \"a\",}\n");
  const std::string unknown = write("unknown.jsonl", good + "{\"prompt\": \"a\", \"max_tokens\": 2}\n");
  const std::string vocab = write("vocab.jsonl", good + "{\"prompt_ids\": [1, 256]}\n");
  const std::string empty = write("empty.jsonl", "\n\n");
  const std::string empty_text = write("empty.txt", "");
  const std::string too_long = write("long.txt", "fine\n" + std::string(70, 'a') + "\n");
  const std::vector<Case> cases = {
      {"--prompts " + bad_json,
       bad_json +
           ":2: not a JSON object: [json.exception.parse_error.101] parse error at line 1, column 16: syntax error "
           "while parsing object key - unexpected '}'; expected string literal"},
      {"--prompts " + unknown, unknown + ":2: unknown field \"max_tokens\": expected " + fields},
      {"--prompts " + vocab,
       vocab + ":2: prompt_ids[1] is 256, outside the model's vocabulary [0, 256) (model.vocab_size)"},
      {"--prompts " + empty, "--prompts file " + empty +
                                 " holds no prompt (2 blank line(s)): expected one prompt a line, each a JSON "
                                 "object with " +
                                 fields},
      {"--prompts " + empty_text,
       "--prompts file " + empty_text + " holds no prompt (0 blank line(s)): expected one prompt a line"},
      {"--prompts " + too_long,
       too_long + ":2: the prompt holds 70 tokens; the model reads at most 64 (model.seq_len)"},
      {"--prompts " + tmp_.file("none.txt"), "--prompts file " + tmp_.file("none.txt") + " does not exist"},
      {"--prompt hi --prompts " + empty,
       "shardtrain generate takes one of --prompt TEXT, --prompt-ids 1,2,3 and --prompts FILE, not both --prompt and "
       "--prompts"},
      {"--prompt-ids 1 --prompts " + empty,
       "shardtrain generate takes one of --prompt TEXT, --prompt-ids 1,2,3 and --prompts FILE, not both --prompt-ids "
       "and --prompts"},
      {"--prompt hi --prompt-ids 1 --prompts " + empty,
       "shardtrain generate takes one of --prompt TEXT, --prompt-ids 1,2,3 and --prompts FILE, not all three"},
      {"", "shardtrain generate needs a prompt: --prompt TEXT, --prompt-ids 1,2,3 or --prompts FILE"},
      {"--prompt-ids 1,2 --chat",
       "--chat renders text as a chat, and --prompt-ids gives token ids, read as they are: give the text with "
       "--prompt, or the ids without --chat"},
      {"--prompt hi --chat",
       "--chat needs a tokenizer with a chat template, and this byte-level model reads text without one: give "
       "--tokenizer FILE (a tokenizer.json)"},
      {"--prompt hi --stop ''", "--stop is empty: expected the text that ends a sequence"}};
  for (const Case& c : cases) EXPECT_EQ(refused(c.args), c.message + "\n") << c.args;
}

}  // namespace
}  // namespace st
