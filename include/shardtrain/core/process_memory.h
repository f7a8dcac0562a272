// How much host memory this process has used: the peak resident set ("high-water mark"), which the CPU
// backend reports as its peak memory (ModelBackend::peak_memory_bytes) in the metrics; and how much the host has
// left (optim.offload_speculative=auto asks before it allocates a second copy of the offloaded state).
//
//   int64_t peak = st::process_peak_rss_bytes();   // e.g. 412.3 MiB after a tiny run
#pragma once

#include <cstdint>

namespace st {

// The peak resident set size of this process in bytes since it started (exec): Linux's VmHWM from
// /proc/self/status, or getrusage's ru_maxrss where that file cannot be read. Never decreases; > 0 for
// any running process. All threads of the process share it (FakeWorld ranks see the same number).
int64_t process_peak_rss_bytes();

// Host memory available for new allocations without swapping, in bytes: Linux's MemAvailable from /proc/meminfo
// (free memory plus what the page cache can give back), or 0 where that cannot be read.
int64_t host_available_bytes();

}  // namespace st
