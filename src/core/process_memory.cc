#include "shardtrain/core/process_memory.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"

namespace st {
namespace {

// The bytes of a "Key:   123 kB" line of a /proc file, or 0 when the file or key is missing.
int64_t proc_kib_field(const char* path, const std::string& key) {
  std::ifstream file(path);
  std::string line;
  while (std::getline(file, line)) {
    if (line.rfind(key, 0) != 0) continue;
    std::istringstream in(line.substr(key.size()));
    int64_t kib = 0;
    if (in >> kib && kib > 0) return kib * 1024;
  }
  return 0;
}

// The first number in a one-line file (cgroup files), or -1 if it is missing or not a number ("max").
int64_t read_number(const std::string& path) {
  std::ifstream file(path);
  int64_t n = -1;
  if (!(file >> n)) return -1;
  return n;
}

}  // namespace

int64_t process_peak_rss_bytes() {
  // VmHWM first: ru_maxrss survives execve on Linux, so a process started by a big parent (mpirun, a test
  // driver) can report its parent's peak.
  if (const int64_t hwm = proc_kib_field("/proc/self/status", "VmHWM:"); hwm > 0) return hwm;
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) == 0 && u.ru_maxrss > 0) return static_cast<int64_t>(u.ru_maxrss) * 1024;  // KiB
  return 0;
}

int64_t host_available_bytes() { return proc_kib_field("/proc/meminfo", "MemAvailable:"); }

HostMemoryLimits host_memory_limits() {
  HostMemoryLimits l;
  l.mem_available = host_available_bytes();
  // cgroup v2: the files of this process's own cgroup (the path after "0::" in /proc/self/cgroup); inside a
  // container that is usually the root of /sys/fs/cgroup. v1: the memory controller's root as mounted.
  std::string v2_dir = "/sys/fs/cgroup";
  {
    std::ifstream self("/proc/self/cgroup");
    std::string line;
    while (std::getline(self, line))
      if (line.rfind("0::", 0) == 0 && line.size() > 4) v2_dir += line.substr(3);
  }
  int64_t limit = read_number(v2_dir + "/memory.max"), used = read_number(v2_dir + "/memory.current");
  if (limit < 0) {
    limit = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    used = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  }
  // "max" (v2) reads as -1; v1 writes "no limit" as a number near 2^63.
  if (limit >= 0 && limit < (int64_t{1} << 62) && used >= 0) {
    l.cgroup_limit = limit;
    l.cgroup_free = std::max<int64_t>(0, limit - used);
  }
  auto headroom = [](int resource, const char* in_use_key, int64_t* free, int64_t* lim) {
    rlimit r{};
    if (getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return;
    *lim = static_cast<int64_t>(std::min<rlim_t>(r.rlim_cur, static_cast<rlim_t>(INT64_MAX)));
    *free = std::max<int64_t>(0, *lim - proc_kib_field("/proc/self/status", in_use_key));
  };
  headroom(RLIMIT_AS, "VmSize:", &l.as_free, &l.as_limit);
  headroom(RLIMIT_DATA, "VmData:", &l.data_free, &l.data_limit);
  return l;
}

HostMemoryBudget host_memory_budget(const HostMemoryLimits& l, int local_ranks, double cap_gib) {
  const int64_t ranks = std::max(local_ranks, 1);
  const std::string shared = ranks > 1 ? str_cat(", shared by the ", ranks, " ranks on this host") : std::string();
  HostMemoryBudget b;
  b.bytes = l.mem_available / ranks;
  b.limited_by = str_cat("the host has ", format_gib(l.mem_available), " available (MemAvailable)", shared);
  auto consider = [&b](int64_t bytes, const std::string& why) {
    if (bytes >= 0 && bytes < b.bytes) {
      b.bytes = bytes;
      b.limited_by = why;
    }
  };
  if (l.cgroup_free >= 0)
    consider(l.cgroup_free / ranks, str_cat("the cgroup's memory limit (memory.max) of ", format_gib(l.cgroup_limit),
                                            " leaves ", format_gib(l.cgroup_free), shared));
  if (l.as_free >= 0)
    consider(l.as_free, str_cat("the address-space limit (RLIMIT_AS, ulimit -v) of ", format_gib(l.as_limit),
                                " leaves ", format_gib(l.as_free), " to this process"));
  if (l.data_free >= 0)
    consider(l.data_free, str_cat("the data-segment limit (RLIMIT_DATA, ulimit -d) of ", format_gib(l.data_limit),
                                  " leaves ", format_gib(l.data_free), " to this process"));
  cap_host_memory_budget(&b, cap_gib);
  return b;
}

void cap_host_memory_budget(HostMemoryBudget* b, double cap_gib) {
  if (cap_gib <= 0) return;
  const int64_t cap = static_cast<int64_t>(cap_gib * static_cast<double>(int64_t{1} << 30));
  if (cap >= b->bytes) return;
  b->bytes = cap;
  b->limited_by = str_cat("dist.max_host_mem_gib caps each rank at ", format_gib(cap));
}

}  // namespace st
