// Raw text read as bytes: every byte of the file(s) is one token in [0, 256), so the vocabulary is 256
// and the model needs model.vocab_size >= 256. Several files (a glob) are concatenated in sorted order
// with nothing in between. Files are memory-mapped, not copied.
//
//   auto src = st::open_text_source("books/*.txt", /*vocab_size=*/256);   // src->vocab_size() == 256
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shardtrain/data/file_token_source.h"

namespace st {

inline constexpr int kByteVocab = 256;

// Opens `path` (one file or a glob, expanded by expand_data_path(): sorted). Throws kBadInput naming
// model.vocab_size when vocab_size < 256, naming the file when one is empty (0 bytes). `key` names the config key
// that gave `path` in the errors about the pattern.
std::unique_ptr<FileTokenSource> open_text_source(const std::string& path, int vocab_size,
                                                  const std::string& key = "data.path");

// Opens the given files, in the order given, as one byte stream. describe() is `label` followed by
// " (K files, N bytes)". Same checks as open_text_source(); `paths` must not be empty.
std::unique_ptr<FileTokenSource> open_text_files(const std::vector<std::string>& paths, int vocab_size,
                                                 const std::string& label);

}  // namespace st
