#include "shardtrain/core/process_memory.h"

#include <sys/resource.h>

#include <fstream>
#include <sstream>
#include <string>

namespace st {

int64_t process_peak_rss_bytes() {
  // VmHWM first: ru_maxrss survives execve on Linux, so a process started by a big parent (mpirun, a test
  // driver) can report its parent's peak.
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) != 0) continue;
    std::istringstream in(line.substr(6));
    int64_t kib = 0;
    if (in >> kib && kib > 0) return kib * 1024;
  }
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) == 0 && u.ru_maxrss > 0) return static_cast<int64_t>(u.ru_maxrss) * 1024;  // KiB
  return 0;
}

int64_t host_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    int64_t kib = 0;
    if (in >> kib && kib > 0) return kib * 1024;
  }
  return 0;
}

}  // namespace st
