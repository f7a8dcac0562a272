// Added tokens (special tokens such as "<|endoftext|>", and others a model was given after its BPE was trained),
// found in the text before pre-tokenization as Hugging Face's AddedVocabulary finds them: leftmost-longest matches
// of the tokens' contents, scanning on from the end of each match, with each token's flags applied:
//   single_word: the match counts only if no word character (Unicode \w) touches it on either side;
//   lstrip / rstrip: the match also takes the white space (Unicode White_Space) before / after it.
// A match dropped by single_word is still stepped over (the scan goes on from its end), as Hugging Face's is.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace st::text {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// One of Hugging Face's two tries: the tokens matched on the raw text (normalized false) or those matched on the
// normalized text (normalized true, each by its normalized content).
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  // `patterns[i]` is the text that finds `tokens[i]` (its content, or its normalized content); none empty, none
  // twice.
  AddedTokenMatcher(const std::vector<std::string>& patterns, const std::vector<AddedToken>& tokens);

  bool empty() const { return tokens_.empty(); }

  // Cuts `text` into the stretches between tokens and the tokens: on_text(std::string_view) for each non-empty
  // stretch, on_token(int32_t id) for each token, in order.
  template <typename OnText, typename OnToken>
  void split(std::string_view text, OnText&& on_text, OnToken&& on_token) const {
    if (tokens_.empty()) {
      if (!text.empty()) on_text(text);
      return;
    }
    size_t start_offset = 0;  // Hugging Face's names: the end of the last token taken
    size_t from = 0;
    Match m;
    while (next_match(text, from, &m)) {
      from = m.end;
      const Flags& t = tokens_[m.token];
      size_t start = m.begin, stop = m.end;
      if (t.single_word && (word_before(text, start) || word_after(text, stop))) continue;
      if (t.lstrip) start = std::max(white_space_start(text, start), start_offset);
      if (t.rstrip) stop += white_space_length(text, stop);
      if (start_offset < start) on_text(text.substr(start_offset, start - start_offset));
      on_token(t.id);
      start_offset = stop;
    }
    if (start_offset < text.size()) on_text(text.substr(start_offset));
  }

 private:
  struct Flags {
    int32_t id;
    bool single_word, lstrip, rstrip;
  };
  struct Match {
    size_t begin, end;
    int token;  // index into tokens_
  };
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;  // sorted by byte
    int32_t token = -1;                                       // the token whose pattern ends here
  };

  // The leftmost-longest match that starts at or after `from`.
  bool next_match(std::string_view text, size_t from, Match* m) const;
  int32_t child(int32_t node, unsigned char b) const;

  // Whether a word character (Unicode \w) ends just before `at` / starts at `at`.
  static bool word_before(std::string_view text, size_t at);
  static bool word_after(std::string_view text, size_t at);
  // Where the run of white space that ends at `at` starts; the length of the run that starts at `at`.
  static size_t white_space_start(std::string_view text, size_t at);
  static size_t white_space_length(std::string_view text, size_t at);

  std::vector<Flags> tokens_;
  std::vector<Node> nodes_;  // a byte trie of the patterns; node 0 is the root
  std::array<bool, 256> first_byte_{};
};

}  // namespace st::text
