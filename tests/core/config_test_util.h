// The fixture of the config tests: a fresh directory per test for the INI files it writes, and the path of a
// shipped config. Shared by config_test.cc and shipped_configs_test.cc (one fixture type, so one test suite).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace st::testing {

// A fresh directory per test for the INI files it writes.
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "shardtrain_config_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::string write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }

  std::filesystem::path dir_;
};

inline std::string shipped(const std::string& name) {
  return std::string(SHARDTRAIN_SOURCE_DIR) + "/configs/" + name;
}

}  // namespace st::testing
