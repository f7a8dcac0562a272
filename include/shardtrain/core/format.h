// Byte counts as text for logs and error messages, in binary units with two decimals:
//
//   st::format_mib(int64_t{3} << 19)   // "1.50 MiB"
//   st::format_gib(int64_t{1} << 30)   // "1.00 GiB"
#pragma once

#include <cstdint>
#include <string>

namespace st {

// bytes / 2^20 as "%.2f MiB".
std::string format_mib(int64_t bytes);

// bytes / 2^30 as "%.2f GiB".
std::string format_gib(int64_t bytes);

}  // namespace st
