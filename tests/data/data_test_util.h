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

// The raw bytes of a file in the llm.c layout: a 256 x int32 header (magic, version, count), then the elements.
template <typename U>
std::string llmc_file_bytes(const std::vector<U>& elements, int32_t magic, int32_t version, int64_t header_count) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(header_count < 0 ? static_cast<int64_t>(elements.size()) : header_count);
  std::string out(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  out.append(reinterpret_cast<const char*>(elements.data()), elements.size() * sizeof(U));
  return out;
}

// The raw bytes of an llm.c shard holding `tokens`; header fields can be overridden to make bad files.
struct LlmcShard {
  std::vector<uint16_t> tokens;
  int32_t magic = 20240520;
  int32_t version = 1;
  int64_t header_count = -1;  // -1: tokens.size()

  std::string bytes() const { return llmc_file_bytes(tokens, magic, version, header_count); }
};

// The same with uint32 tokens (llm.c's Llama 3 shards).
struct LlmcShard32 {
  std::vector<uint32_t> tokens;
  int32_t magic = 20240801;
  int32_t version = 7;
  int64_t header_count = -1;

  std::string bytes() const { return llmc_file_bytes(tokens, magic, version, header_count); }
};

// The raw bytes of a loss mask (NAME.mask beside NAME.bin).
struct LlmcMask {
  std::vector<uint8_t> bytes_of_tokens;  // one a token: 1 target, 0 not
  int32_t magic = 20261201;
  int32_t version = 1;
  int64_t header_count = -1;

  std::string bytes() const { return llmc_file_bytes(bytes_of_tokens, magic, version, header_count); }
};

inline void write_llmc(const std::string& path, const std::vector<uint16_t>& tokens) {
  write_bytes(path, LlmcShard{tokens}.bytes());
}

inline void write_llmc32(const std::string& path, const std::vector<uint32_t>& tokens) {
  write_bytes(path, LlmcShard32{tokens}.bytes());
}

// Writes `mask` as the loss mask of the shard at `shard_path` (NAME.bin -> NAME.mask).
inline void write_mask(const std::string& shard_path, const std::vector<uint8_t>& mask) {
  std::string path = shard_path;
  if (path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0) path.resize(path.size() - 4);
  write_bytes(path + ".mask", LlmcMask{mask}.bytes());
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
