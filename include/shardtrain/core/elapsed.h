// Wall-clock time elapsed on the monotonic clock, for timings in logs, metrics and benchmarks.
//
//   const auto t0 = std::chrono::steady_clock::now();
//   work();
//   const double s = seconds_since(t0);
#pragma once

#include <chrono>

namespace st {

// Seconds from t0 to now on std::chrono::steady_clock (never negative: the clock does not go back).
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace st
