// Small Hugging Face tokenizer.json files for tests that need a tokenizer but not a real one: GPT-2's byte-level
// spelling of a byte, and a byte-level BPE whose ids 0..255 are the bytes themselves (no merges) followed by added
// tokens. Header-only.
//
//   write_bytes(dir.file("tokenizer.json"), byte_tokenizer_json({"<|endoftext|>"}).dump());   // 257 ids
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace st::testing {

// GPT-2's byte-level spelling of byte b (openai/gpt-2 encoder.py, bytes_to_unicode), as UTF-8.
inline std::string spell(unsigned char b) {
  int next = 0;
  uint32_t cp = 0;
  for (int x = 0; x <= b; ++x) {
    const bool printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
    cp = printable ? x : 256 + next++;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Ids 0..255: the bytes; then `added`, special tokens, in order. GPT-2's pre-tokenizer and ByteLevel decoder.
inline nlohmann::json byte_tokenizer_json(const std::vector<std::string>& added) {
  using nlohmann::json;
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[spell(static_cast<unsigned char>(b))] = b;
  json tokens = json::array();
  for (size_t i = 0; i < added.size(); ++i)
    tokens.push_back({{"id", 256 + static_cast<int>(i)},
                      {"content", added[i]},
                      {"single_word", false},
                      {"lstrip", false},
                      {"rstrip", false},
                      {"normalized", false},
                      {"special", true}});
  json j;
  j["version"] = "1.0";
  j["added_tokens"] = tokens;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", json::array()}};
  return j;
}

}  // namespace st::testing
