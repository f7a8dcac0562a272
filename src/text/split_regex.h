// The pre-tokenizer's split: a regex (GPT-2's, or a Split pre-tokenizer's pattern) cuts the text into pieces with
// Hugging Face's "Isolated" behaviour: every match is a piece, and so is every stretch between two matches; empty
// pieces are dropped. Matching follows the Oniguruma iteration Hugging Face uses (an empty match right where the
// previous match ended is skipped by one character).
//
// The pattern is written for Oniguruma and runs on PCRE2 (8-bit, UTF, Unicode properties, JIT): see
// pcre2_pattern() for what is translated and what is refused.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace st::text {

// GPT-2's split pattern, which a ByteLevel pre-tokenizer with use_regex applies.
inline constexpr char kGpt2SplitPattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// `pattern` (Oniguruma's Ruby syntax, Hugging Face's dialect) rewritten so that PCRE2 gives it the same meaning:
// \s becomes the class of Unicode White_Space (Oniguruma's \s; PCRE2's also holds U+180E) and \S its complement.
// Refused with kBadInput naming `where`: \S inside a class, \w \W \b \B (word characters differ), \h \H (a hex
// digit in Oniguruma, horizontal space in PCRE2), \Q \E (a quotation in PCRE2 only) and inline options other than
// i and x ((?m) is dot-all in Oniguruma, multi-line in PCRE2).
std::string pcre2_pattern(std::string_view pattern, const std::string& where);

class SplitRegex {
 public:
  // Compiles `pattern` (Oniguruma's syntax, translated by pcre2_pattern); kBadInput naming `where` if it does not.
  SplitRegex(std::string_view pattern, const std::string& where);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Calls piece(std::string_view) for each piece of `text` (valid UTF-8), in order. Thread-safe.
  template <typename Piece>
  void split(std::string_view text, Piece&& piece) const {
    size_t prev = 0;          // end of the last piece
    size_t from = 0;          // where the next search starts
    size_t last_end = kNone;  // end of the last accepted match
    size_t begin, end;
    while (from <= text.size() && find(text, from, &begin, &end)) {
      if (begin == end && end == last_end) {  // Oniguruma's find_iter: step over one character
        from = end + char_length(text, end);
        continue;
      }
      if (prev < begin) piece(text.substr(prev, begin - prev));
      if (begin < end) piece(text.substr(begin, end - begin));
      prev = end;
      from = end;
      last_end = end;
    }
    if (prev < text.size()) piece(text.substr(prev));
  }

 private:
  static constexpr size_t kNone = ~size_t{0};
  // The leftmost match starting at or after `from`; false if none.
  bool find(std::string_view text, size_t from, size_t* begin, size_t* end) const;
  static size_t char_length(std::string_view text, size_t at);

  void* code_ = nullptr;  // pcre2_code_8
  bool jit_ = false;
  std::string where_;
};

}  // namespace st::text
