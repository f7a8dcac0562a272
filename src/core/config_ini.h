// Private to src/core: reading INI text and --section.key=value overrides into a Config, with errors that name the
// file, line and key.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"

namespace st::config_internal {

// The whole file; throws kBadInput naming `path` if it is missing, a directory or unreadable.
std::string read_config_file(const std::string& path);

// The keys a config set explicitly, "section.key" -> where the value in force came from: the file (as `origin`
// names it: its path) or "the command line". Keys absent here hold their defaults.
using ExplicitKeys = std::map<std::string, std::string>;

// Sets the fields of `cfg` from `ini_text` (when given; `label`, such as "config file PATH", names it in errors) and
// then from `overrides`, which win, and returns the keys either set. Throws kBadInput for a malformed line, an
// unknown section or key (with the keys the section does hold), a value of the wrong type (with what it must look
// like) or a key set twice. Cross-key checks are config_validate.h's.
ExplicitKeys parse_into(Config& cfg, const std::optional<std::string>& ini_text, const std::string& label,
                        const std::string& origin, const std::vector<std::string>& overrides);

}  // namespace st::config_internal
