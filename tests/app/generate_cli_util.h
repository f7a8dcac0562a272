// What the tests of `shardtrain generate` share (generate_cli_test.cc, generate_chat_test.cc, generate_load_test.cc):
// a small GPT-2 file of random weights for --init.from, optionally one that always samples a given token, and the
// binary's stdout alone, read as ids or parsed as JSON lines.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../common/run_shardtrain.h"
#include "../model/decoder_test_util.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/core/config.h"
#include "shardtrain/model/units.h"

namespace st::testing {

// A 1-layer GPT-2 (n_embd 16, seq_len 64) of `vocab` tokens: random_weights(seed), whose logits spread over many
// tokens. With `always`, its final norm gives every position the same output, ones, and token `always`'s embedding
// row is 10s: that token's logit is 160 against the others' few units, so it is sampled at every step.
struct GptFile {
  std::string path;
  std::string keys;  // the --model.* keys that read it
};

inline GptFile write_gpt_file(const std::string& path, int vocab, uint64_t seed,
                              std::optional<int32_t> always = std::nullopt) {
  ModelConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.n_embd = 16;
  c.vocab_size = vocab;
  c.seq_len = 64;
  std::vector<std::vector<float>> w = random_weights(c, seed);
  const std::vector<UnitLayout> units = build_units(c);
  if (always) {
    const TensorSpec& lnf_w = units.back().tensor("lnf.weight");
    const TensorSpec& lnf_b = units.back().tensor("lnf.bias");
    for (int64_t k = 0; k < c.n_embd; ++k) {
      w.back()[static_cast<size_t>(lnf_w.offset + k)] = 0.0f;
      w.back()[static_cast<size_t>(lnf_b.offset + k)] = 1.0f;
      w.front()[static_cast<size_t>(units.front().tensor("wte").offset + *always * c.n_embd + k)] = 10.0f;
    }
  }
  std::vector<const float*> ptrs;
  for (const std::vector<float>& u : w) ptrs.push_back(u.data());
  write_hf_gpt2(path, c, units, ptrs);
  return {path, "--model.n_layer=1 --model.n_head=2 --model.n_embd=16 --model.vocab_size=" + std::to_string(vocab) +
                    " --model.seq_len=64"};
}

// `s` as one shell word.
inline std::string quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// `generate --init.from FILE` with `args`: its exit code and stdout alone.
inline CliResult generate_stdout(const GptFile& f, const std::string& args) {
  return run_shardtrain("generate --init.from " + f.path + " " + f.keys + " " + args + " 2>/dev/null");
}

// The ids of a comma-separated list ("1,2,3"), as generate prints ids.
inline std::vector<int32_t> parse_ids(const std::string& list) {
  std::vector<int32_t> ids;
  std::istringstream in(list);
  for (std::string item; std::getline(in, item, ',');) ids.push_back(std::stoi(item));
  return ids;
}

// The JSON lines of `output`, each parsed (a failure for a line that does not parse).
inline std::vector<nlohmann::json> json_lines(const std::string& output) {
  std::vector<nlohmann::json> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::parse_error& e) {
      ADD_FAILURE() << "not a JSON line: " << line << ": " << e.what();
    }
  }
  return out;
}

}  // namespace st::testing
