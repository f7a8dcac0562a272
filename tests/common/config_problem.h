// What load_config says of a set of command-line overrides (no file): its error's text, or "" when it takes them.
//
//   EXPECT_NE(testing::config_problem({"--lora.rank=-1"}).find("lora.rank must be >= 0"), std::string::npos);
//   testing::expect_refused({{{"--lora.rank=-1"}, "lora.rank must be >= 0"}});  // each case's error names its text
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <utility>
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

// Each case's overrides are refused with an error that contains the case's text.
inline void expect_refused(const std::vector<std::pair<std::vector<std::string>, std::string>>& cases) {
  for (const auto& [overrides, want] : cases) {
    const std::string got = config_problem(overrides);
    EXPECT_NE(got.find(want), std::string::npos) << got;
  }
}

}  // namespace st::testing
