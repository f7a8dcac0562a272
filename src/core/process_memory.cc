#include "shardtrain/core/process_memory.h"

#include <sys/resource.h>

#include <fstream>
#include <sstream>
#include <string>

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

}  // namespace st
