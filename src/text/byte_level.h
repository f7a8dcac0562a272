// GPT-2's byte-level alphabet: every byte is spelled as one printable Unicode character, so that a vocabulary of
// strings can hold any byte sequence. Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF are spelled as themselves (as code
// points); the other 68 bytes, in increasing order, as U+0100, U+0101, ... (so ' ' is U+0120 'Ġ' and '\n' is
// U+010A 'Ċ'). The vocabulary of a byte-level BPE is written in this spelling; the tokenizer works on raw bytes and
// converts at load time.
#pragma once

#include <string>
#include <string_view>

namespace st::text {

// The character that spells byte `b`.
char32_t byte_level_char(unsigned char b);

// The byte that `c` spells, or -1 if `c` is not in the alphabet.
int byte_level_byte(char32_t c);

// The bytes that `spelling` (UTF-8) stands for; false when it holds a character outside the alphabet (then *bytes is
// unspecified).
bool byte_level_decode(std::string_view spelling, std::string* bytes);

// The byte-level spelling (UTF-8) of `bytes`.
std::string byte_level_encode(std::string_view bytes);

}  // namespace st::text
