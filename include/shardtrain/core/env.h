// Every environment variable shardtrain reads, declared in one table (NCCL_PARAM style), so that
// `shardtrain --help-env` can list them and nothing reads getenv() behind the table's back.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace st {

struct EnvVar {
  const char* name;
  const char* default_value;  // used when the variable is unset or empty
  const char* help;
};

// The declared variables, in the order --help-env prints them.
const std::vector<EnvVar>& env_table();

// The value of a declared variable, or its default. Asking for an undeclared name is an internal error.
std::string env_get(std::string_view name);

}  // namespace st
