// The decoder follows Table 3-7 of the Unicode Standard (well-formed byte sequences): the second byte's range
// depends on the lead (E0: A0..BF, ED: 80..9F, F0: 90..BF, F4: 80..8F), which is what excludes overlong forms,
// surrogates and code points above U+10FFFF; the bytes accepted before the first one out of range form the maximal
// subpart that one U+FFFD replaces.
#include "utf8.h"

#include <cstring>

namespace st::text {
namespace {

bool is_cont(unsigned char b) { return (b & 0xC0) == 0x80; }

// The first byte that is not ASCII at or after p, or end; eight bytes a step.
const unsigned char* skip_ascii(const unsigned char* p, const unsigned char* end) {
  while (end - p >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    if (w & 0x8080808080808080ull) break;
    p += 8;
  }
  while (p < end && *p < 0x80) ++p;
  return p;
}

}  // namespace

int utf8_decode(const unsigned char* p, const unsigned char* end, char32_t* cp) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // the second byte's range
  char32_t c;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    c = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    c = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    c = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return -1;  // a continuation byte, C0, C1 or F5..FF: never part of a valid sequence
  }
  for (int i = 1; i <= need; ++i) {
    if (p + i >= end) return -i;
    const unsigned char b = p[i];
    if (i == 1 ? (b < lo || b > hi) : !is_cont(b)) return -i;
    c = (c << 6) | (b & 0x3F);
  }
  *cp = c;
  return need + 1;
}

bool utf8_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  for (;;) {
    p = skip_ascii(p, end);
    if (p == end) return true;
    char32_t cp;
    const int n = utf8_decode(p, end, &cp);
    if (n < 0) return false;
    p += n;
  }
}

std::string_view utf8_lossy(std::string_view s, std::string* buf) {
  if (utf8_valid(s)) return s;
  buf->clear();
  buf->reserve(s.size() + s.size() / 2);
  const auto* begin = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = begin + s.size();
  const unsigned char* p = begin;
  for (;;) {
    const unsigned char* q = skip_ascii(p, end);
    buf->append(reinterpret_cast<const char*>(p), q - p);
    p = q;
    if (p == end) break;
    char32_t cp;
    const int n = utf8_decode(p, end, &cp);
    if (n > 0) {
      buf->append(reinterpret_cast<const char*>(p), n);
      p += n;
    } else {
      utf8_append(kReplacementChar, buf);
      p += -n;
    }
  }
  return *buf;
}

void utf8_append(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t utf8_last(const char* begin, const char* end, int* len) {
  const char* p = end - 1;
  while (p > begin && is_cont(static_cast<unsigned char>(*p))) --p;
  char32_t cp = 0;
  const int n =
      utf8_decode(reinterpret_cast<const unsigned char*>(p), reinterpret_cast<const unsigned char*>(end), &cp);
  *len = n > 0 ? n : 1;
  return n > 0 ? cp : kReplacementChar;
}

size_t utf8_unfinished_tail(std::string_view s) {
  const auto* begin = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = begin + s.size();
  // An unfinished character is at most 3 bytes: its lead is the last byte that is not a continuation byte.
  for (size_t k = 1; k <= 3 && k <= s.size(); ++k) {
    const unsigned char b = end[-static_cast<ptrdiff_t>(k)];
    if (is_cont(b)) continue;
    char32_t cp;
    // A lead byte whose sequence is cut short by the end alone: utf8_decode accepted every byte up to it.
    const bool lead = b >= 0xC2 && b <= 0xF4;
    return lead && utf8_decode(end - k, end, &cp) == -static_cast<int>(k) ? k : 0;
  }
  return 0;
}

}  // namespace st::text
