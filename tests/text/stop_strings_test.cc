// StopStrings on text given piece by piece: the released pieces concatenate to the text before the first stop string
// (all of it when there is none), each released as soon as no stop string can start in it, and the end that could
// still start one held back; against a brute-force reference on every way of cutting random texts into pieces.
#include "shardtrain/text/stop_strings.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"

namespace st {
namespace {

// What push() returns for each piece, then finish()'s.
std::vector<std::string> released(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopStrings s(stops);
  std::vector<std::string> out;
  for (const std::string& p : pieces) out.push_back(s.push(p));
  out.push_back(s.finish());
  return out;
}

using Pieces = std::vector<std::string>;

TEST(StopStrings, WithoutStopsEveryPieceIsReleasedWhole) {
  EXPECT_EQ(released({}, {"ab", "", "c\n"}), (Pieces{"ab", "", "c\n", ""}));
}

TEST(StopStrings, APossibleStartIsHeldUntilTheNextPieceSettlesIt) {
  // "##" then "#": the stop "###" across three pieces; the text before it is "a".
  EXPECT_EQ(released({"###"}, {"a#", "#", "#b", "more"}), (Pieces{"a", "", "", "", ""}));
  // A false start: "ab" held, released with the "d" that rules the stop out.
  EXPECT_EQ(released({"abc"}, {"xab", "d", "ab"}), (Pieces{"x", "abd", "", "ab"}));
  // At the end, what is held back is the text's end.
  EXPECT_EQ(released({"\n\n"}, {"end\n"}), (Pieces{"end", "\n"}));
  // The stop in one piece: the text up to it, and nothing after.
  EXPECT_EQ(released({"STOP"}, {"go STOP here"}), (Pieces{"go ", ""}));
  // A stop at the very start.
  EXPECT_EQ(released({"x"}, {"xyz"}), (Pieces{"", ""}));
}

TEST(StopStrings, TheFirstOccurrenceOfAnyStopEndsTheText) {
  // "b" occurs before "cd": the text is "a"; the stops' order does not matter.
  EXPECT_EQ(released({"cd", "b"}, {"abcd"}), (Pieces{"a", ""}));
  EXPECT_EQ(released({"b", "cd"}, {"abcd"}), (Pieces{"a", ""}));
  // Overlapping self-prefixes: "aab" in "aaab" starts at 1.
  EXPECT_EQ(released({"aab"}, {"aa", "a", "b"}), (Pieces{"", "a", "", ""}));
  // Held for the longer stop's sake, then released when the shorter one cannot start there either.
  EXPECT_EQ(released({"xyz", "yq"}, {"1xy", "w"}), (Pieces{"1", "xyw", ""}));
}

TEST(StopStrings, MultiByteCharactersAreMatchedWhole) {
  // "é" (C3 A9) is a stop; "è" (C3 A8) shares its first byte, held until the second settles it.
  EXPECT_EQ(released({"\xC3\xA9"}, {"a\xC3", "\xA8", "b\xC3\xA9"}), (Pieces{"a", "\xC3\xA8", "b", ""}));
}

TEST(StopStrings, AfterTheStopPiecesAreIgnored) {
  StopStrings s({"!"});
  EXPECT_EQ(s.push("hi!"), "hi");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.push("more"), "");
  EXPECT_EQ(s.finish(), "");
}

TEST(StopStrings, AnEmptyStopIsABug) {
  try {
    StopStrings s({"a", ""});
    FAIL() << "an empty stop string was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
  }
}

// The reference after the text so far, `text`: the length released: the first stop's position when one occurs, else
// the first position from which the rest of the text is a proper prefix of a stop (the text's length when none).
size_t reference_released(const std::vector<std::string>& stops, const std::string& text, bool* stopped) {
  size_t first = std::string::npos;
  for (const std::string& s : stops) first = std::min(first, text.find(s));
  *stopped = first != std::string::npos;
  if (*stopped) return first;
  for (size_t j = 0; j < text.size(); ++j)
    for (const std::string& s : stops)
      if (text.size() - j < s.size() && s.compare(0, text.size() - j, text, j) == 0) return j;
  return text.size();
}

TEST(StopStrings, EveryCutOfRandomTextsReleasesWhatTheReferenceDoes) {
  const std::vector<std::vector<std::string>> stop_sets = {{"ab"}, {"aab", "ba"}, {"abcab", "c"}, {"bbb", "abba"}};
  for (uint64_t trial = 0; trial < 400; ++trial) {
    const std::vector<std::string>& stops = stop_sets[trial % stop_sets.size()];
    std::string text;
    const auto len = static_cast<size_t>(uniform_at(trial, 1, 0) * 14);
    for (size_t k = 0; k < len; ++k) text += static_cast<char>('a' + static_cast<int>(uniform_at(trial, 2, k) * 3));
    StopStrings s(stops);
    std::string so_far, out;
    bool done = false;
    for (size_t at = 0; at < text.size() && !done;) {
      const size_t n = std::min(text.size() - at, 1 + static_cast<size_t>(uniform_at(trial, 3, at) * 4));
      so_far += text.substr(at, n);
      out += s.push(text.substr(at, n));
      at += n;
      bool stopped = false;
      const size_t want = reference_released(stops, so_far, &stopped);
      ASSERT_EQ(out, so_far.substr(0, want)) << "text " << text << ", after " << so_far;
      ASSERT_EQ(s.stopped(), stopped) << "text " << text << ", after " << so_far;
      done = stopped;
    }
    if (!done) EXPECT_EQ(out + s.finish(), text) << text;
  }
}

}  // namespace
}  // namespace st
