// A whole file that is small by nature (a config, a config.json, a tokenizer.json), read with a bound, so that a
// path that is not such a file cannot stall or exhaust the process: a FIFO is refused before open(2) would wait for
// a writer, a device or directory is refused unread, and a file over the limit is refused from its size alone,
// before a byte of it is read.
//
//   const std::string text = st::read_small_file(path, {"config file '" + path + "'", "a config file", 1 << 20,
//                                                       "(a config must be one: write it to a file)"});
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace st {

struct SmallFile {
  std::string shown;        // the file in messages: "config file 'PATH'", "tokenizer file PATH"
  std::string kind;         // what the limit is for: "a config file" ("over the 1.00 MiB limit for a config file")
  int64_t max_bytes = 0;    // the largest file read
  std::string not_regular;  // what follows "is a directory, not a regular file" in that refusal
};

// The whole of `path`. kBadInput, its message starting with f.shown, when the path does not exist ("does not
// exist"), is not a regular file (what it is, then f.not_regular), holds more than f.max_bytes (its size and the
// limit; also when it grows past the limit while it is read) or cannot be opened or read (the OS's error).
std::string read_small_file(const std::string& path, const SmallFile& f);

// What a path that is not a regular file is, for the message that refuses it: "a directory", "a FIFO (...)", ...
const char* file_kind(mode_t mode);

}  // namespace st
