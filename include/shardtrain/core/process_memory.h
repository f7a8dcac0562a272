// How much host memory this process has used: the peak resident set ("high-water mark"), which the CPU
// backend reports as its peak memory (ModelBackend::peak_memory_bytes) in the metrics.
//
//   int64_t peak = st::process_peak_rss_bytes();   // e.g. 412.3 MiB after a tiny run
#pragma once

#include <cstdint>

namespace st {

// The peak resident set size of this process in bytes since it started (exec): Linux's VmHWM from
// /proc/self/status, or getrusage's ru_maxrss where that file cannot be read. Never decreases; > 0 for
// any running process. All threads of the process share it (FakeWorld ranks see the same number).
int64_t process_peak_rss_bytes();

}  // namespace st
