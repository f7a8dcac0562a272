// The key table as a reference for people: the listing `shardtrain --help` prints, and docs/config.md.
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

namespace {

// A key's default as help and docs/config.md show it: "" for an empty string.
std::string shown_default(const Key& k) {
  const std::string value = k.field->format(Config{});
  return value.empty() ? "\"\"" : value;
}

// Markdown table cells: a '|' would end the cell.
std::string escape_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

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
      os << "  " << std::left << std::setw(static_cast<int>(name_width)) << k->full_name() << "  "
         << std::setw(static_cast<int>(default_width + 11)) << ("(default: " + shown_default(*k) + ")") << "  "
         << k->description << "\n";
    }
    if (in_section.empty()) os << "  (no keys in this version)\n";
  }
  return os.str();
}

std::string config_markdown() {
  std::ostringstream os;
  os << "# Configuration keys\n"
        "\n"
        "Generated from the key table in `src/core/config_keys.cc` by `shardtrain --help-config=markdown`; edit the "
        "table, not this file, and regenerate it from the repository root with:\n"
        "\n"
        "    ./build/shardtrain --help-config=markdown > docs/config.md\n"
        "\n"
        "The test `ConfigDoc.*` (tests/app/config_doc_test.cc) fails while this file and the binary disagree.\n"
        "\n"
        "A config is an INI file: `[section]` lines, `key = value` lines, and `#` comments. Any key can be set on "
        "the command line as `--section.key=value` (or `--section.key value`), which wins over the file; "
        "`--section.key=` sets a string key to empty. Unknown sections and keys are refused with the file, line "
        "and key; a value of the wrong type names the key, the value and what it must look like. A key left out "
        "takes the default below.\n"
        "\n"
        "`--config` is given at most once, and names a regular file of at most 1 MiB: a FIFO, a pipe such as "
        "`<(...)` or a device is refused before it is read. A number must be finite (`inf` and `nan` are refused) "
        "and within its type and the range below; an integer past its type says `out of range [MIN, MAX]`. String "
        "values hold no control characters and at most 4095 bytes (a path). Errors show a value with control bytes "
        "and bytes that are not UTF-8 as `\\xNN`, cut after 80 characters with its size.\n";
  for (const char* section : kSections) {
    os << "\n## [" << section << "]\n\n";
    const std::vector<const Key*> in_section = keys_in(section);
    if (in_section.empty()) {
      os << "No keys.\n";
      continue;
    }
    os << "| key | value | default | description |\n|---|---|---|---|\n";
    for (const Key* k : in_section) {
      os << "| `" << k->full_name() << "` | " << escape_cell(k->field->expected()) << " | `"
         << escape_cell(shown_default(*k)) << "` | " << escape_cell(k->description) << " |\n";
    }
  }
  return os.str();
}

}  // namespace st
