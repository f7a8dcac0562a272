// Test tool for the Hugging Face checks (tests/model/transformers_check.py): the logits shardtrain computes for one
// sequence, at every position, for a model initialised from init.from (a Hugging Face directory or weights file).
//
//   logits_dump --config FILE --tokens 5,17,3,... --out FILE [--section.key=value ...]
// writes float32 [len(tokens), vocab_size] (little-endian, row-major) to FILE. Position p's row is the last row of
// the model run on tokens[0..p] (a causal model computes the same row on the whole sequence).
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"
#include "shardtrain/train/step_engine.h"

int main(int argc, char** argv) {
  std::optional<std::string> config;
  std::string out, token_list;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--config" && i + 1 < argc) {
      config = argv[++i];
    } else if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--tokens" && i + 1 < argc) {
      token_list = argv[++i];
    } else {
      overrides.push_back(a);
    }
  }
  if (out.empty() || token_list.empty()) {
    std::fprintf(stderr, "usage: logits_dump --config FILE --tokens A,B,... --out FILE [--section.key=value ...]\n");
    return 2;
  }
  try {
    const st::Config cfg = st::load_config(config, overrides);
    std::vector<int32_t> tokens;
    std::istringstream in(token_list);
    for (std::string t; std::getline(in, t, ',');) tokens.push_back(static_cast<int32_t>(std::stol(t)));
    ST_CHECK(!tokens.empty() && static_cast<int64_t>(tokens.size()) <= cfg.model.seq_len, "1 to model.seq_len = ",
             cfg.model.seq_len, " tokens, got ", tokens.size());
    st::SoloCommunicator comm;
    st::StepEngine engine(cfg, comm);
    if (!cfg.init.from.empty()) st::init_from_weights(cfg.init.from, cfg.model, engine.sharded());
    std::ofstream f(out, std::ios::binary);
    std::vector<float> logits;
    for (size_t len = 1; len <= tokens.size(); ++len) {
      engine.sharded().last_logits(tokens.data(), static_cast<int64_t>(len), &logits);
      ST_CHECK(static_cast<int64_t>(logits.size()) == cfg.model.vocab_size, "logits of ", logits.size(), " entries");
      f.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
    }
    ST_CHECK(f.good(), "cannot write ", out);
  } catch (const st::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return st::exit_code_for(e.kind());
  }
  return 0;
}
