// Hugging Face matches with aho-corasick (MatchKind::LeftmostLongest) and tests the flags with the regex crate's
// Unicode \w (Alphabetic, marks, decimal digits, connector punctuation, Join_Control) and \s (White_Space); the
// same classes come from ICU here. A byte trie stands in for the automaton: the added tokens are few and start with
// few distinct bytes, so the scan skips most of the text with one table lookup a byte.
#include "added_tokens.h"

#include <unicode/uchar.h>

#include <algorithm>

#include "shardtrain/core/error.h"
#include "utf8.h"

namespace st::text {
namespace {

bool is_word_char(char32_t c) {
  const auto cp = static_cast<UChar32>(c);
  if (u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL)) return true;
  const int8_t type = u_charType(cp);
  return type == U_NON_SPACING_MARK || type == U_ENCLOSING_MARK || type == U_COMBINING_SPACING_MARK ||
         type == U_DECIMAL_DIGIT_NUMBER || type == U_CONNECTOR_PUNCTUATION;
}

bool is_white_space(char32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE); }

char32_t first_char(std::string_view text, size_t at, int* len) {
  char32_t c = kReplacementChar;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + at;
  const int n = utf8_decode(p, reinterpret_cast<const unsigned char*>(text.data()) + text.size(), &c);
  *len = n > 0 ? n : 1;
  return c;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<std::string>& patterns, const std::vector<AddedToken>& tokens) {
  ST_CHECK(patterns.size() == tokens.size());
  nodes_.emplace_back();
  for (size_t i = 0; i < patterns.size(); ++i) {
    const std::string& p = patterns[i];
    ST_CHECK(!p.empty());
    int32_t node = 0;
    for (unsigned char b : p) {
      int32_t next = child(node, b);
      if (next < 0) {
        next = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
        auto& children = nodes_[node].children;
        children.insert(std::lower_bound(children.begin(), children.end(), std::make_pair(b, int32_t{-1})),
                        std::make_pair(b, next));
      }
      node = next;
    }
    ST_CHECK(nodes_[node].token < 0, "added token pattern given twice");
    nodes_[node].token = static_cast<int32_t>(tokens_.size());
    first_byte_[static_cast<unsigned char>(p[0])] = true;
    tokens_.push_back(Flags{tokens[i].id, tokens[i].single_word, tokens[i].lstrip, tokens[i].rstrip});
  }
}

int32_t AddedTokenMatcher::child(int32_t node, unsigned char b) const {
  const auto& children = nodes_[node].children;
  const auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(b, int32_t{-1}));
  return it != children.end() && it->first == b ? it->second : -1;
}

bool AddedTokenMatcher::next_match(std::string_view text, size_t from, Match* m) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
    int32_t node = 0;
    int longest = -1;
    size_t longest_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      node = child(node, static_cast<unsigned char>(text[j]));
      if (node < 0) break;
      if (nodes_[node].token >= 0) {
        longest = nodes_[node].token;
        longest_end = j + 1;
      }
    }
    if (longest >= 0) {
      *m = Match{i, longest_end, longest};
      return true;
    }
  }
  return false;
}

bool AddedTokenMatcher::word_before(std::string_view text, size_t at) {
  if (at == 0) return false;
  int len;
  return is_word_char(utf8_last(text.data(), text.data() + at, &len));
}

bool AddedTokenMatcher::word_after(std::string_view text, size_t at) {
  if (at >= text.size()) return false;
  int len;
  return is_word_char(first_char(text, at, &len));
}

size_t AddedTokenMatcher::white_space_start(std::string_view text, size_t at) {
  while (at > 0) {
    int len;
    if (!is_white_space(utf8_last(text.data(), text.data() + at, &len))) break;
    at -= len;
  }
  return at;
}

size_t AddedTokenMatcher::white_space_length(std::string_view text, size_t at) {
  size_t n = 0;
  while (at + n < text.size()) {
    int len;
    if (!is_white_space(first_char(text, at + n, &len))) break;
    n += len;
  }
  return n;
}

}  // namespace st::text
