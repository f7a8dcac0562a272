// The built-in corpus "@fortunes": the text files of Debian's `fortunes` package, read as bytes.
//
// Directory: env SHARDTRAIN_FORTUNES_DIR (default /usr/share/games/fortunes), read through env_get().
// Files, in this order:
//   * every top-level entry of that directory (subdirectories such as off/ are not entered)
//   * that is a regular file, or a symlink to one,
//   * whose name does not end in ".dat" (strfile indexes) or ".u8" (Debian's UTF-8 aliases),
//     and, for a symlink, whose target's name does not either,
//   * that is not empty,
//   * sorted bytewise by name; an entry whose resolved file was already taken (two links to one file)
//     is taken once, at its first name.
// Concatenated as bytes, exactly like a data.format=text glob.
//
//   auto src = st::open_fortunes_source(/*vocab_size=*/256);
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shardtrain/data/file_token_source.h"

namespace st {

inline constexpr char kFortunesPath[] = "@fortunes";

// The corpus files in `dir`, as full paths, in stream order (rules above). Throws kBadInput naming the
// directory, the Debian package `fortunes` and `apt-get install fortunes` if `dir` does not exist or
// holds no such file.
std::vector<std::string> fortunes_files(const std::string& dir);

// Opens the corpus from env_get("SHARDTRAIN_FORTUNES_DIR"). Needs vocab_size >= 256.
std::unique_ptr<FileTokenSource> open_fortunes_source(int vocab_size);

}  // namespace st
