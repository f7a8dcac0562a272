#include "shardtrain/core/log.h"

#include <cstdio>
#include <mutex>

#include "shardtrain/core/env.h"

namespace st {
namespace {

LogLevel parse_level(const std::string& s) {
  if (s == "debug") return LogLevel::kDebug;
  if (s == "warn") return LogLevel::kWarn;
  if (s == "error") return LogLevel::kError;
  return LogLevel::kInfo;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "D";
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kWarn:
      return "W";
    case LogLevel::kError:
      return "E";
  }
  return "?";
}

}  // namespace

bool log_enabled(LogLevel level) {
  static const LogLevel threshold = parse_level(env_get("SHARDTRAIN_LOG_LEVEL"));
  return level >= threshold;
}

void log_line(LogLevel level, const std::string& msg) {
  static std::mutex mu;  // one line at a time from the feeder threads
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "%s %s %s\n", level_name(level), process_prefix().c_str(), msg.c_str());
  std::fflush(stderr);
}

}  // namespace st
