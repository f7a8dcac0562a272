#include "shardtrain/core/excerpt.h"

#include <cstdint>
#include <cstdio>

namespace st {
namespace {

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// The length of the valid UTF-8 character of two or more bytes that starts at text[i], or 0 when there is none
// (a stray byte, an overlong form, a surrogate, a code point past U+10FFFF) or it is a C1 control (U+0080-U+009F),
// which some terminals obey.
size_t utf8_length(std::string_view text, size_t i) {
  const auto at = [&](size_t k) { return static_cast<uint8_t>(text[i + k]); };
  const uint8_t lead = at(0);
  size_t n = 0;
  uint8_t lo = 0x80;  // the range of the second byte, narrowed for the leads that would otherwise allow
  uint8_t hi = 0xBF;  // overlong forms, surrogates or code points past U+10FFFF
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2;
    if (lead == 0xC2) lo = 0xA0;  // U+0080-U+009F: C1 controls
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    n = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > text.size() || at(1) < lo || at(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (!is_continuation(at(k))) return 0;
  return n;
}

}  // namespace

std::string excerpt(std::string_view text, size_t max_chars) {
  std::string out;
  size_t chars = 0;
  size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<uint8_t>(text[i]);
    size_t bytes = 1;  // of `text` this character takes
    size_t width = 1;  // characters it takes in `out`
    bool escape = false;
    if (b >= 0x80) {
      bytes = utf8_length(text, i);
      escape = bytes == 0;
      if (escape) bytes = 1;
    } else {
      escape = b < 0x20 || b == 0x7F;
    }
    if (escape) width = 4;
    if (chars + width > max_chars) break;
    if (escape) {
      char buf[5];
      std::snprintf(buf, sizeof(buf), "\\x%02x", b);
      out += buf;
    } else {
      out.append(text.substr(i, bytes));
    }
    chars += width;
    i += bytes;
  }
  if (i < text.size()) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace st
