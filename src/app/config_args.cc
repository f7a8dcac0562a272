#include "config_args.h"

#include <cstring>

#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"

ConfigArgs parse_config_args(const std::vector<std::string>& args) {
  ConfigArgs out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    std::optional<std::string> file;
    if (a == "--help" || a == "-h") {
      out.help = true;
    } else if (a == "--config") {
      if (i + 1 >= args.size()) ST_BAD_INPUT("--config needs a file name");
      file = args[++i];
    } else if (a.rfind("--config=", 0) == 0) {
      file = a.substr(std::strlen("--config="));
    } else {
      out.overrides.push_back(a);
    }
    if (!file) continue;
    if (out.config) {
      ST_BAD_INPUT("--config given twice ('", st::excerpt(*out.config, st::kExcerptPathChars), "', then '",
                   st::excerpt(*file, st::kExcerptPathChars),
                   "'): give one config file, and change its keys with --section.key=value");
    }
    out.config = std::move(file);
  }
  return out;
}
