// The system's text for an errno value, for error messages that name what failed and why.
//
//   if (::fsync(fd) != 0) ST_FAULT("fsync of ", path, " failed: ", errno_text());   // "... failed: Input/output error"
//   *why = errno_text_lower(err);                                                   // "connection refused"
#pragma once

#include <cerrno>
#include <string>

namespace st {

// strerror(err) as the system words it ("No such file or directory"). The default reads errno where it is called,
// so call it before anything else can change errno.
std::string errno_text(int err = errno);

// The same with its first letter in lower case, for text that goes on inside parentheses or after a comma
// ("(connection refused)").
std::string errno_text_lower(int err = errno);

}  // namespace st
