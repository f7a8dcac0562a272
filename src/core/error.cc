#include "shardtrain/core/error.h"

#include <unistd.h>

#include <atomic>
#include <climits>

namespace st {
namespace {

// Set once at start-up, read by every error path; atomics so a late set from the launcher is safe
// against threads that are already logging.
std::atomic<int> g_rank{-1};
std::atomic<int> g_world{0};

std::string host_name() {
  char buf[HOST_NAME_MAX + 1] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

}  // namespace

int exit_code_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kBadInput:
      return kExitBadInput;
    case ErrorKind::kFault:
      return kExitFault;
    case ErrorKind::kInternal:
      return kExitInternal;
  }
  return kExitInternal;
}

void set_process_identity(int rank, int world_size) {
  g_rank.store(rank);
  g_world.store(world_size);
}

std::string process_prefix() {
  static const std::string host = host_name();
  const int rank = g_rank.load();
  if (rank < 0) return "[" + host + "]";
  return str_cat("[rank ", rank, "/", g_world.load(), " ", host, "]");
}

namespace detail {

void fail(ErrorKind kind, const char* file, int line, const char* expr, const std::string& detail) {
  if (file == nullptr) throw Error(kind, process_prefix() + " " + detail);
  std::string msg = process_prefix() + " " + file + ":" + std::to_string(line) + ": ";
  if (expr != nullptr && expr[0] != '\0') msg += std::string("check failed: ") + expr;
  if (!detail.empty()) msg += (expr != nullptr && expr[0] != '\0' ? " (" + detail + ")" : detail);
  throw Error(kind, msg);
}

}  // namespace detail
}  // namespace st
