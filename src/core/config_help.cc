// The key table as a reference for people: the listing `shardtrain --help` prints.
#include <algorithm>
#include <iomanip>
#include <sstream>

#include "config_keys.h"
#include "shardtrain/core/config.h"

namespace st {

using config_internal::Key;
using config_internal::keys;
using config_internal::keys_in;
using config_internal::kSections;

std::string config_help() {
  const Config defaults;
  size_t name_width = 0;
  size_t default_width = 0;
  for (const auto& k : keys()) {
    name_width = std::max(name_width, k.full_name().size());
    default_width = std::max(default_width, k.field->format(defaults).size());
  }
  std::ostringstream os;
  for (const char* section : kSections) {
    os << "[" << section << "]\n";
    const std::vector<const Key*> in_section = keys_in(section);
    for (const Key* k : in_section) {
      std::string value = k->field->format(defaults);
      if (value.empty()) value = "\"\"";
      os << "  " << std::left << std::setw(static_cast<int>(name_width)) << k->full_name() << "  "
         << std::setw(static_cast<int>(default_width + 11)) << ("(default: " + value + ")") << "  " << k->description
         << "\n";
    }
    if (in_section.empty()) os << "  (no keys in this version)\n";
  }
  return os.str();
}

}  // namespace st
