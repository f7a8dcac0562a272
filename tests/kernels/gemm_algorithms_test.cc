// The GEMM algorithm list a checkpoint keeps (manifest field gemm_algorithms.plans): format and parse.
#include "shardtrain/kernels/gemm_algorithms.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "shardtrain/core/error.h"

namespace st {
namespace {

GemmAlgorithmEntry entry(int64_t base, uint64_t word) {
  GemmAlgorithmEntry e;
  for (size_t i = 0; i < e.key.size(); ++i) e.key[i] = base + static_cast<int64_t>(i);
  for (size_t i = 0; i < e.algo.size(); ++i) e.algo[i] = word ^ (uint64_t{0x9e3779b97f4a7c15} * i);
  return e;
}

TEST(GemmAlgorithms, RoundTripKeepsEveryWord) {
  const std::vector<GemmAlgorithmEntry> entries = {entry(0, 0), entry(16384, std::numeric_limits<uint64_t>::max()),
                                                   entry(int64_t{1} << 40, 0x0123456789abcdef)};
  const std::string text = format_gemm_algorithms(entries);
  EXPECT_EQ(text.substr(0, 7), "gemm 0 ");
  const std::vector<GemmAlgorithmEntry> back = parse_gemm_algorithms(text);
  ASSERT_EQ(back.size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(back[i].key, entries[i].key) << i;
    EXPECT_EQ(back[i].algo, entries[i].algo) << i;
  }
  EXPECT_EQ(format_gemm_algorithms(back), text);
  EXPECT_TRUE(parse_gemm_algorithms("").empty());
  EXPECT_EQ(parse_gemm_algorithms("\n" + text + "\n\n").size(), entries.size());  // blank lines are skipped
}

TEST(GemmAlgorithms, BadLinesNameTheLine) {
  const std::string good = format_gemm_algorithms({entry(3, 7)});
  const std::string line = good.substr(0, good.size() - 1);
  const struct {
    std::string text;
    int line;
  } cases[] = {
      {"gemm 1 2 3\n", 1},                              // too few fields
      {good + "GEMM" + line.substr(4) + "\n", 2},       // wrong tag
      {good + line + " 0\n", 2},                        // one field too many
      {line.substr(0, line.rfind(' ')) + " xyz\n", 1},  // not hex
      {"gemm x" + line.substr(6) + "\n", 1},            // key not an integer
  };
  for (const auto& c : cases) {
    try {
      parse_gemm_algorithms(c.text);
      ADD_FAILURE() << "accepted: " << c.text;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kBadInput);
      const std::string want =
          "GEMM algorithm list, line " + std::to_string(c.line) + ": expected \"gemm\", 19 integers and 8 hex words";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace st
