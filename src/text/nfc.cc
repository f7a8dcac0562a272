// ICU's Normalizer2 reads and writes UTF-8 directly (isNormalizedUTF8, normalizeUTF8), so nothing is converted to
// UTF-16. The NFC instance is the object unorm2_getNFCInstance() returns, taken through the C++ API because the C
// API's quick check (unorm2_quickCheck) accepts UTF-16 only and the filter (FilteredNormalizer2) is C++.
#include "nfc.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uniset.h>

#include <memory>

#include "shardtrain/core/error.h"

namespace st::text {
namespace {

class Unicode9Nfc {
 public:
  Unicode9Nfc() {
    UErrorCode status = U_ZERO_ERROR;
    const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
    ST_CHECK(U_SUCCESS(status) && nfc != nullptr, "ICU's NFC normalizer is unavailable: ", u_errorName(status));
    assigned_ = icu::UnicodeSet(icu::UnicodeString("[:age=9.0:]", -1, US_INV), status);
    ST_CHECK(U_SUCCESS(status), "ICU's set of characters of Unicode 9.0: ", u_errorName(status));
    assigned_.freeze();
    filtered_ = std::make_unique<icu::FilteredNormalizer2>(*nfc, assigned_);
  }
  const icu::Normalizer2& get() const { return *filtered_; }

 private:
  icu::UnicodeSet assigned_;
  std::unique_ptr<icu::FilteredNormalizer2> filtered_;
};

const icu::Normalizer2& normalizer() {
  static const Unicode9Nfc instance;
  return instance.get();
}

// Every code point below U+0300 is NFC_Quick_Check=Yes with combining class 0, so text without one at or above
// U+0300 is in NFC. In UTF-8 those are exactly the sequences whose lead byte is 0xCC or above, and no other byte
// (ASCII or continuation) reaches 0xCC.
bool below_u0300(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0xCC) return false;
  }
  return true;
}

}  // namespace

std::string_view nfc(std::string_view s, std::string* buf) {
  if (below_u0300(s)) return s;
  const icu::Normalizer2& n = normalizer();
  UErrorCode status = U_ZERO_ERROR;
  const icu::StringPiece piece(s.data(), static_cast<int32_t>(s.size()));
  if (n.isNormalizedUTF8(piece, status) && U_SUCCESS(status)) return s;
  ST_CHECK(U_SUCCESS(status), "ICU NFC quick check: ", u_errorName(status));
  buf->clear();
  icu::StringByteSink<std::string> sink(buf, static_cast<int32_t>(s.size()));
  n.normalizeUTF8(0, piece, sink, nullptr, status);
  ST_CHECK(U_SUCCESS(status), "ICU NFC normalization: ", u_errorName(status));
  return *buf;
}

}  // namespace st::text
