// What load_config says of a set of command-line overrides (no file): its error's text, or "" when it takes them.
//
//   EXPECT_NE(testing::config_problem({"--lora.rank=-1"}).find("lora.rank must be >= 0"), std::string::npos);
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"

namespace st::testing {

inline std::string config_problem(const std::vector<std::string>& overrides) {
  try {
    load_config(std::nullopt, overrides);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string();
}

}  // namespace st::testing
