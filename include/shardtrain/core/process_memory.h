// How much host memory this process has used: the peak resident set ("high-water mark"), which the CPU
// backend reports as its peak memory (ModelBackend::peak_memory_bytes) in the metrics; and how much the host has
// left, and what
// bounds it (the CPU backend's memory plan is checked against host_memory_budget before it allocates).
//
//   int64_t peak = st::process_peak_rss_bytes();   // e.g. 412.3 MiB after a tiny run
#pragma once

#include <cstdint>
#include <string>

namespace st {

// The peak resident set size of this process in bytes since it started (exec): Linux's VmHWM from
// /proc/self/status, or getrusage's ru_maxrss where that file cannot be read. Never decreases; > 0 for
// any running process. All threads of the process share it (FakeWorld ranks see the same number).
int64_t process_peak_rss_bytes();

// Host memory available for new allocations without swapping, in bytes: Linux's MemAvailable from /proc/meminfo
// (free memory plus what the page cache can give back), or 0 where that cannot be read.
int64_t host_available_bytes();

// Everything that bounds the host memory this process can still allocate, in bytes; -1 where a limit is not
// set. The host's and the cgroup's are shared by every process on the host (or in the cgroup); the rlimits are
// this process's own.
struct HostMemoryLimits {
  int64_t mem_available = 0;  // MemAvailable of /proc/meminfo (0 if unreadable)
  int64_t cgroup_free = -1;   // the cgroup's memory.max less memory.current (v2), or limit_in_bytes less usage (v1)
  int64_t cgroup_limit = -1;  // memory.max (or limit_in_bytes) itself
  int64_t as_free = -1;       // RLIMIT_AS (ulimit -v) less this process's address space (VmSize)
  int64_t as_limit = -1;
  int64_t data_free = -1;  // RLIMIT_DATA (ulimit -d) less this process's data segment (VmData)
  int64_t data_limit = -1;
};
HostMemoryLimits host_memory_limits();

// What one of `local_ranks` processes on a host may plan to allocate: the smallest of the host's MemAvailable
// and the cgroup's free memory, each split evenly between the ranks, this process's rlimit headroom, and
// `cap_gib` GiB where positive (dist.max_host_mem_gib). `limited_by` says which limit that is, with its figures, for
// messages.
struct HostMemoryBudget {
  int64_t bytes = 0;
  std::string limited_by;
};
HostMemoryBudget host_memory_budget(const HostMemoryLimits& limits, int local_ranks, double cap_gib);
// `cap_gib` GiB, where positive and below b->bytes, becomes the budget, named as dist.max_host_mem_gib.
void cap_host_memory_budget(HostMemoryBudget* b, double cap_gib);

}  // namespace st
