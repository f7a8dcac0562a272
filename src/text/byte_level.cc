#include "byte_level.h"

#include <array>

#include "utf8.h"

namespace st::text {
namespace {

struct Alphabet {
  std::array<char32_t, 256> to_char{};
  std::array<int, 324> to_byte{};  // the alphabet's largest character is U+0143

  Alphabet() {
    to_byte.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      to_byte[to_char[b]] = b;
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

char32_t byte_level_char(unsigned char b) { return alphabet().to_char[b]; }

int byte_level_byte(char32_t c) { return c < alphabet().to_byte.size() ? alphabet().to_byte[c] : -1; }

bool byte_level_decode(std::string_view spelling, std::string* bytes) {
  bytes->clear();
  const auto* p = reinterpret_cast<const unsigned char*>(spelling.data());
  const auto* end = p + spelling.size();
  while (p < end) {
    char32_t c;
    const int n = utf8_decode(p, end, &c);
    if (n < 0) return false;
    const int b = byte_level_byte(c);
    if (b < 0) return false;
    bytes->push_back(static_cast<char>(b));
    p += n;
  }
  return true;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) utf8_append(byte_level_char(static_cast<unsigned char>(b)), &out);
  return out;
}

}  // namespace st::text
