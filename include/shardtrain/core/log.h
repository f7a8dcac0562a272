// Logging: one line per call, to stderr, prefixed with the level and the process identity.
// The level comes from SHARDTRAIN_LOG_LEVEL (see core/env.h). Training progress lines that a person
// reads go to stdout through train/, not through here.
//
//   ST_LOG_INFO("data: ", n, " tokens from ", path);
#pragma once

#include <string>

#include "shardtrain/core/error.h"

namespace st {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

bool log_enabled(LogLevel level);
void log_line(LogLevel level, const std::string& msg);

}  // namespace st

#define ST_LOG_AT_(level, ...) \
  do {                                                                   \
    if (::st::log_enabled(level)) ::st::log_line(level, ::st::str_cat(__VA_ARGS__)); \
  } while (0)
#define ST_LOG_DEBUG(...) ST_LOG_AT_(::st::LogLevel::kDebug, __VA_ARGS__)
#define ST_LOG_INFO(...) ST_LOG_AT_(::st::LogLevel::kInfo, __VA_ARGS__)
#define ST_LOG_WARN(...) ST_LOG_AT_(::st::LogLevel::kWarn, __VA_ARGS__)
#define ST_LOG_ERROR(...) ST_LOG_AT_(::st::LogLevel::kError, __VA_ARGS__)
