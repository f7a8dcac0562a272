// UTF-8 as the tokenizer reads it: one code point at a time, validation, and the lossy replacement Hugging Face's
// callers apply before it sees the text (each maximal invalid subpart becomes U+FFFD, Unicode's "best practice" of
// chapter 3, which Rust's String::from_utf8_lossy, WHATWG's decoder and Node's Buffer.toString() follow).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace st::text {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Decodes the sequence at p (p < end). Returns its length (1..4) and sets *cp when it is a valid UTF-8 sequence
// (shortest form, no surrogate, at most U+10FFFF); otherwise returns -n, n >= 1 being the length of the maximal
// subpart of an ill-formed sequence there (the bytes that the one U+FFFD replaces).
int utf8_decode(const unsigned char* p, const unsigned char* end, char32_t* cp);

// Whether all of `s` is valid UTF-8.
bool utf8_valid(std::string_view s);

// `s` itself when it is valid UTF-8; otherwise its lossy copy, written to *buf, with each maximal invalid subpart
// replaced by U+FFFD.
std::string_view utf8_lossy(std::string_view s, std::string* buf);

// How many bytes at the end of `s` begin a character that is valid so far but unfinished (a lead byte followed by
// fewer continuation bytes than it needs): 0 to 3. Cutting them off leaves a prefix whose lossy copy does not depend on
// what follows, so that utf8_lossy(prefix) + utf8_lossy(rest + more) == utf8_lossy(s + more) for any `more`.
size_t utf8_unfinished_tail(std::string_view s);

// Appends the UTF-8 encoding of `cp` (<= U+10FFFF, not a surrogate).
void utf8_append(char32_t cp, std::string* out);

// The code point that ends just before `end` in valid UTF-8 starting at `begin` (begin < end); *len gets its length.
char32_t utf8_last(const char* begin, const char* end, int* len);

}  // namespace st::text
