#include "shardtrain/core/env.h"

#include <cstdlib>

#include "shardtrain/core/error.h"

namespace st {

const std::vector<EnvVar>& env_table() {
  static const std::vector<EnvVar> table = {
      {"SHARDTRAIN_LOG_LEVEL", "info", "log verbosity on stderr: debug | info | warn | error"},
      {"SHARDTRAIN_FORTUNES_DIR", "/usr/share/games/fortunes",
       "where the built-in corpus (Debian package 'fortunes') is read from"},
      {"SHARDTRAIN_CONFIG_DIR", SHARDTRAIN_DEFAULT_CONFIG_DIR,
       "where `shardtrain train` without --config finds default.ini"},
  };
  return table;
}

std::string env_get(std::string_view name) {
  for (const EnvVar& v : env_table()) {
    if (name == v.name) {
      const char* value = std::getenv(v.name);
      return (value != nullptr && value[0] != '\0') ? std::string(value) : std::string(v.default_value);
    }
  }
  ST_CHECK(false, "environment variable ", name, " is not declared in env_table()");
}

}  // namespace st
