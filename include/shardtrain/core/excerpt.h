// User-supplied text as an error message or a log line may show it: a value from a config file or the command line,
// a path, a line of a file that may be binary. Bytes that could act on a terminal (ASCII control characters, DEL,
// bytes that are not UTF-8, C1 controls) are written as \xNN, and a long text is cut after `max_chars` characters
// with the size of the whole:
//
//   st::excerpt("lr\x1b[2J")                  // "lr\x1b[2J" with the ESC byte written as the four characters \x1b
//   st::excerpt(std::string(10'000'000, 'a'))  // 80 'a' then "... (10000000 bytes)"
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace st {

// The default cut: a value and its key still fit on one line of a terminal.
inline constexpr size_t kExcerptChars = 80;
// The cut for a path: PATH_MAX, so that any path the system can open is shown whole.
inline constexpr size_t kExcerptPathChars = 4096;

// `text` with every byte that is not printable ASCII or part of a valid, printable UTF-8 character written as \xNN
// (a backslash itself stays as it is), cut after `max_chars` characters of that form (an escape is never split)
// and then followed by "... (N bytes)", N being the size of the whole of `text`.
std::string excerpt(std::string_view text, size_t max_chars = kExcerptChars);

}  // namespace st
