#include "shardtrain/core/format.h"

#include <cstdio>

namespace st {
namespace {

std::string format_units(int64_t bytes, double unit, const char* name) {
  char b[48];
  std::snprintf(b, sizeof(b), "%.2f %s", static_cast<double>(bytes) / unit, name);
  return b;
}

}  // namespace

std::string format_mib(int64_t bytes) { return format_units(bytes, double(int64_t{1} << 20), "MiB"); }

std::string format_gib(int64_t bytes) { return format_units(bytes, double(int64_t{1} << 30), "GiB"); }

}  // namespace st
