// Helpers shared by the data tests: a temporary directory that cleans itself up, writers for llm.c
// shards and raw files, and a way to capture a kBadInput message.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "../common/temp_dir.h"
#include "shardtrain/core/error.h"

namespace st::testing {

// The raw bytes of an llm.c shard holding `tokens`; header fields can be overridden to make bad files.
struct LlmcShard {
  std::vector<uint16_t> tokens;
  int32_t magic = 20240520;
  int32_t version = 1;
  int64_t header_count = -1;  // -1: tokens.size()

  std::string bytes() const {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = static_cast<int32_t>(header_count < 0 ? static_cast<int64_t>(tokens.size()) : header_count);
    std::string out(reinterpret_cast<const char*>(header.data()), header.size() * 4);
    out.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 2);
    return out;
  }
};

inline void write_llmc(const std::string& path, const std::vector<uint16_t>& tokens) {
  write_bytes(path, LlmcShard{tokens}.bytes());
}

// Runs fn, which must throw st::Error of kind kBadInput; returns its message ("" and a failure otherwise).
inline std::string bad_input_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const st::Error& e) {
    EXPECT_EQ(e.kind(), st::ErrorKind::kBadInput) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected st::Error of kind kBadInput, nothing was thrown";
  return "";
}

inline bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Every token of a source, read in one call.
template <typename Source>
std::vector<int32_t> read_all(const Source& src) {
  std::vector<int32_t> out(static_cast<size_t>(src.size()));
  src.read(0, src.size(), out.data());
  return out;
}

}  // namespace st::testing
