// Unicode Normalization Form C as Hugging Face's "NFC" normalizer computes it, through ICU.
//
// Hugging Face normalizes with the crate unicode-normalization-alignments, whose tables are Unicode 9.0: a character
// assigned later has no decomposition, combining class 0 and no composition there. ICU's NFC (a later Unicode) is
// therefore applied through a filter of the characters assigned by Unicode 9.0 (ICU's FilteredNormalizer2 over
// [:age=9.0:]): each later character is left as it is and stops reordering and composition across it, which is
// what a starter without mappings does. Normalization of characters never changes between Unicode versions once
// they are assigned, so the two agree on everything else.
#pragma once

#include <string>
#include <string_view>

namespace st::text {

// `s` (valid UTF-8) itself when it is already in that NFC, which is the common case and costs one pass (a byte scan
// for text below U+0300, else ICU's quick check); otherwise its NFC form, written to *buf.
std::string_view nfc(std::string_view s, std::string* buf);

}  // namespace st::text
