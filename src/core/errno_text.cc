#include "shardtrain/core/errno_text.h"

#include <cctype>
#include <cstring>

namespace st {

std::string errno_text(int err) { return std::strerror(err); }

std::string errno_text_lower(int err) {
  std::string s = errno_text(err);
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

}  // namespace st
