// docs/config.md is the checked-in output of `shardtrain --help-config=markdown`. These tests fail when the file and
// the binary drift apart: a key added, renamed, re-described or given another default without regenerating it.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "../common/run_shardtrain.h"
#include "shardtrain/core/config.h"

namespace {

constexpr const char* kRegenerate =
    "regenerate it from the repository root with: ./build/shardtrain --help-config=markdown > docs/config.md";

std::string read_docs() {
  const std::string path = std::string(SHARDTRAIN_SOURCE_DIR) + "/docs/config.md";
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path << " cannot be read; " << kRegenerate;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The binary's stdout alone, which is what `> docs/config.md` captures (st::testing::run_shardtrain mixes in stderr).
std::string markdown_from_binary() {
  const std::string cmd = std::string(SHARDTRAIN_BINARY) + " --help-config=markdown";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "cannot run " << cmd;
    return out;
  }
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd << " failed (status " << status << ")";
  return out;
}

// "line N: docs/config.md has '...', the binary prints '...'" for the first line where the two differ.
std::string first_difference(const std::string& docs, const std::string& printed) {
  std::istringstream a(docs), b(printed);
  std::string line_a, line_b;
  for (int number = 1;; ++number) {
    const bool more_a = static_cast<bool>(std::getline(a, line_a));
    const bool more_b = static_cast<bool>(std::getline(b, line_b));
    if (!more_a && !more_b) return "they differ only in line endings";
    if (!more_a) line_a = "<end of file>";
    if (!more_b) line_b = "<end of output>";
    if (!more_a || !more_b || line_a != line_b)
      return "line " + std::to_string(number) + ": docs/config.md has '" + line_a + "', the binary prints '" + line_b +
             "'";
  }
}

TEST(ConfigDoc, DocsFileIsWhatTheBinaryPrints) {
  const std::string printed = markdown_from_binary();
  const std::string docs = read_docs();
  ASSERT_FALSE(printed.empty());
  EXPECT_TRUE(docs == printed) << "docs/config.md is not the output of `shardtrain --help-config=markdown` ("
                               << first_difference(docs, printed) << "); " << kRegenerate;
}

// Independent of the Markdown renderer: every key `shardtrain --help` lists has a row in docs/config.md with the same
// default, and the file has no row for a key that --help does not list.
TEST(ConfigDoc, EveryKeyOfHelpIsInDocsWithItsDefault) {
  const st::testing::CliResult help = st::testing::run_shardtrain("--help");
  ASSERT_EQ(help.code, 0) << help.output;
  // "  train.steps   (default: 600)   total optimizer steps ..."
  const std::regex help_line(R"(^  ([a-z0-9_]+\.[a-z0-9_]+) +\(default: (.*?)\)  )");
  // "| `train.steps` | an integer | `600` | total optimizer steps ... |"
  const std::regex doc_row(R"(^\| `([a-z0-9_]+\.[a-z0-9_]+)` \| (?:[^|\\]|\\.)* \| `([^`]*)` \| )");

  std::map<std::string, std::string> help_defaults, doc_defaults;
  std::smatch m;
  std::string line;
  std::istringstream help_lines(help.output);
  while (std::getline(help_lines, line))
    if (std::regex_search(line, m, help_line)) help_defaults[m[1]] = m[2];
  std::istringstream doc_lines(read_docs());
  while (std::getline(doc_lines, line))
    if (std::regex_search(line, m, doc_row)) doc_defaults[m[1]] = m[2];

  // to_ini() writes one "key = value" line per key: the count --help must list.
  size_t ini_keys = 0;
  std::istringstream ini(st::to_ini(st::Config{}));
  while (std::getline(ini, line)) ini_keys += line.find(" =") != std::string::npos && line[0] != '#';
  ASSERT_EQ(help_defaults.size(), ini_keys) << "keys read from shardtrain --help:\n" << help.output;
  for (const auto& [key, value] : help_defaults) {
    const auto found = doc_defaults.find(key);
    if (found == doc_defaults.end()) {
      ADD_FAILURE() << key << " (shardtrain --help) has no row in docs/config.md; " << kRegenerate;
      continue;
    }
    EXPECT_EQ(found->second, value) << key << ": docs/config.md gives the default " << found->second
                                    << ", shardtrain --help " << value << "; " << kRegenerate;
  }
  for (const auto& [key, value] : doc_defaults)
    EXPECT_EQ(help_defaults.count(key), 1u)
        << key << " is in docs/config.md but not in shardtrain --help; " << kRegenerate;
}

}  // namespace
