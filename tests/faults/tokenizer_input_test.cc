// A hostile --tokenizer (data.tokenizer): a huge file, a directory, a file moved away after training. Every command
// that reads a tokenizer (tokenize, train's end-of-run sample, generate) must refuse a file over the limit from its
// size, unread, and a directory naming what it is; generate must read one only when it prints text.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "../common/byte_tokenizer.h"
#include "../common/run_shardtrain.h"
#include "../common/temp_dir.h"

namespace st::testing {
namespace {

namespace fs = std::filesystem;

// The "error: ..." line of a run's output (the last one, if several).
std::string error_line(const std::string& output) {
  const auto at = output.rfind("error: ");
  if (at == std::string::npos) return "";
  return output.substr(at, output.find('\n', at) - at);
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A tiny byte-level GPT (vocabulary 300, so that a 257-id tokenizer fits it) trained for one step on the built-in
// corpus with data.tokenizer = `tokenizer`; returns its checkpoint.
std::string train_with_tokenizer(const TempDir& dir, const std::string& tokenizer) {
  const std::string ckpt = dir.file("ckpt");
  const CliResult r = run_shardtrain("train --config " + std::string(SHARDTRAIN_SOURCE_DIR) +
                                     "/configs/tiny.ini --model.vocab_size=300 --model.seq_len=32 "
                                     "--train.micro_batch=8 --train.global_batch=8 --train.eval_every=0 "
                                     "--train.eval_batches=1 --train.sample_tokens=4 --train.steps=1 --ckpt.dir=" +
                                     ckpt + " --data.tokenizer=" + tokenizer);
  EXPECT_EQ(r.code, 0) << r.output;
  return ckpt + "/step_00000001";
}

std::string write_tokenizer(const TempDir& dir, const std::string& name) {
  const std::string path = dir.file(name);
  write_bytes(path, byte_tokenizer_json({"<|endoftext|>"}).dump());
  return path;
}

// 3 GiB, sparse: nothing is written; a reader that read it whole would need more memory than run_bounded allows.
TEST(TokenizerInput, FileOver64MiBIsRefusedUnreadByEveryReader) {
  TempDir dir;
  const std::string huge = dir.file("tokenizer.json");
  write_bytes(huge, "");
  ASSERT_EQ(::truncate(huge.c_str(), int64_t{3} << 30), 0);
  const std::string step = train_with_tokenizer(dir, write_tokenizer(dir, "small.json"));
  const std::string want =
      "tokenizer file " + huge + " is 3221225472 bytes (3.00 GiB), over the 64.00 MiB limit for a tokenizer file";
  for (const std::string& args :
       {"tokenize --tokenizer " + huge + " --out " + dir.file("out/x") + " /usr/share/common-licenses/GPL-3",
        "train --config " + std::string(SHARDTRAIN_SOURCE_DIR) +
            "/configs/tiny.ini --model.vocab_size=300 "
            "--train.steps=1 --data.tokenizer=" +
            huge,
        "generate --ckpt " + step + " --tokenizer " + huge + " --prompt hi"}) {
    const CliResult r = run_bounded(args);
    EXPECT_EQ(r.code, 2) << args << "\n" << r.output;
    EXPECT_TRUE(contains(error_line(r.output), want)) << args << "\n" << r.output;
  }
}

// A directory is named as one, with the tokenizer.json it holds (or that it holds none), not called "not valid JSON".
TEST(TokenizerInput, DirectoryIsNamedWithTheFileItHolds) {
  TempDir dir;
  fs::create_directories(dir.file("model"));
  write_tokenizer(dir, "model/tokenizer.json");
  fs::create_directories(dir.file("empty"));
  const std::string out = " --out " + dir.file("out/x") + " /usr/share/common-licenses/GPL-3";
  const CliResult r = run_bounded("tokenize --tokenizer " + dir.file("model") + out);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_TRUE(contains(error_line(r.output), "tokenizer file " + dir.file("model") +
                                                 " is a directory, not a regular file (it holds a tokenizer.json: did "
                                                 "you mean " +
                                                 dir.file("model/tokenizer.json") + "?)"))
      << r.output;
  const CliResult e = run_bounded("tokenize --tokenizer " + dir.file("empty") + out);
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_TRUE(contains(error_line(e.output), "tokenizer file " + dir.file("empty") +
                                                 " is a directory, not a regular file (expected a Hugging Face "
                                                 "tokenizer.json file; the directory holds none)"))
      << e.output;
}

// The checkpoint records data.tokenizer; once that file has moved, ids in and ids out still work (no tokenizer is
// read), and text is refused naming the file that is gone.
TEST(TokenizerInput, PromptIdsNeedNoTokenizer) {
  TempDir dir;
  const std::string tok = write_tokenizer(dir, "tokenizer.json");
  const std::string step = train_with_tokenizer(dir, tok);
  fs::rename(tok, dir.file("moved.json"));
  const CliResult ids =
      run_bounded("generate --ckpt " + step + " --prompt-ids 72,105 --max-tokens 5 --temperature 0 2>/dev/null");
  EXPECT_EQ(ids.code, 0) << ids.output;
  int commas = 0;
  for (char c : ids.output) commas += c == ',';
  EXPECT_EQ(commas, 4) << ids.output;  // 5 ids
  EXPECT_TRUE(!ids.output.empty() && ids.output.back() == '\n') << ids.output;
  const CliResult text = run_bounded("generate --ckpt " + step + " --prompt hi --max-tokens 5");
  EXPECT_EQ(text.code, 2) << text.output;
  EXPECT_TRUE(contains(error_line(text.output), "tokenizer file " + tok + " does not exist")) << text.output;
  const CliResult given = run_bounded("generate --ckpt " + step + " --tokenizer " + dir.file("moved.json") +
                                      " --prompt hi --max-tokens 5 --temperature 0 2>/dev/null");
  EXPECT_EQ(given.code, 0) << given.output;
}

}  // namespace
}  // namespace st::testing
