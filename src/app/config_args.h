// The arguments of a command that runs a config (train, topo): --config FILE or --config=FILE, at most once, and
// --section.key=value overrides, which win over the file.
#pragma once

#include <optional>
#include <string>
#include <vector>

struct ConfigArgs {
  std::optional<std::string> config;   // the --config file, if given
  std::vector<std::string> overrides;  // every other argument, in order
  bool help = false;                   // --help or -h was given
};

// Throws kBadInput for --config without a file name, and for --config given twice: one file is read, so a second
// would silently replace the first.
ConfigArgs parse_config_args(const std::vector<std::string>& args);
