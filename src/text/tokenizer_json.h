// Reading a Hugging Face tokenizer.json into what the encoder needs, checking every field the encoder depends on
// (see include/shardtrain/text/tokenizer.h for what is accepted). Everything refused is kBadInput naming the file
// and the JSON field, with what was expected and what was found.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "added_tokens.h"

namespace st::text {

struct TokenizerSpec {
  std::vector<std::string> vocab;  // by id: each token's byte-level spelling (UTF-8)
  struct Merge {
    int32_t left, right, merged;
  };
  std::vector<Merge> merges;  // by rank (a pair listed twice appears twice; the later one wins)
  bool ignore_merges = false;
  bool nfc = false;
  std::string split_pattern;      // the pre-tokenizer's regex (Oniguruma syntax)
  std::string split_field;        // "<path>: <field>", for messages about the pattern
  std::vector<AddedToken> added;  // in file order, ids checked against Hugging Face's assignment
};

TokenizerSpec read_tokenizer_json(const std::string& path);

}  // namespace st::text
