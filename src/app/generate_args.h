// The command line of `shardtrain generate` (generate_command.cc): its flags, checked on their own (what needs the
// model, such as a prompt's length or an id's range, is checked once the config is known).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/model/decoder_stage.h"
#include "shardtrain/model/sampling.h"

extern const char* const kGenerateUsage;

// The prompts decoded together when --batch is not given, where the device's memory holds them.
inline constexpr int kDefaultBatch = 16;

struct GenerateArgs {
  std::string dir;        // --ckpt
  std::string init_from;  // --init.from
  // Exactly one of the three (parse_generate_args refuses none or several).
  std::optional<std::string> prompt, prompt_ids, prompts_file;
  bool chat = false;               // --chat
  bool jsonl = false;              // --jsonl
  std::vector<std::string> stops;  // --stop, each non-empty
  int64_t max_tokens = 100;
  int64_t batch = 0;  // --batch: the prompts decoded together; 0: as many as fit, up to kDefaultBatch
  st::LayerSplit split = st::LayerSplit::kAuto;  // --split
  st::SamplingOptions sampling;
  std::vector<std::string> overrides;  // --section.key=value, and --tokenizer as --data.tokenizer
  bool help = false;
};

// kBadInput naming the flag for an unknown flag, a value out of range, a missing source of weights or prompt, and
// flags that exclude each other.
GenerateArgs parse_generate_args(const std::vector<std::string>& args);

// The whole of `text` as an integer; kBadInput naming the flag and `expected` otherwise.
int64_t parse_integer(const std::string& flag, const std::string& text, const std::string& expected);
