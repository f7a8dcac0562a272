#include "shardtrain/data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <mutex>
#include <utility>

#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "shardtrain/core/unique_fd.h"

namespace st {
namespace {

// The live mappings, for the SIGBUS handler: a fixed table, so that the handler reads it without a lock or an
// allocation. A slot is published by storing `begin` last and retired by clearing `begin` first.
struct GuardedMapping {
  std::atomic<uintptr_t> begin{0};
  std::atomic<uintptr_t> end{0};
  std::atomic<const char*> message{nullptr};  // "error: ... data file PATH changed ...\n", owned by the slot
  std::atomic<size_t> length{0};
  std::atomic<bool> taken{false};
};
GuardedMapping g_guarded[kMaxGuardedMappings];
struct sigaction g_previous_sigbus {};

// Only async-signal-safe calls here: write(2), _exit(2), sigaction(2) and raise(3).
extern "C" void on_sigbus(int sig, siginfo_t* info, void* context) {
  // si_addr is meaningful for a fault only (si_code > 0); kill(2) fills the same bytes with its sender's pid.
  const auto addr = info->si_code > 0 ? reinterpret_cast<uintptr_t>(info->si_addr) : 0;
  for (const GuardedMapping& g : g_guarded) {
    const uintptr_t begin = g.begin.load(std::memory_order_acquire);
    if (addr != 0 && begin != 0 && addr >= begin && addr < g.end.load(std::memory_order_relaxed)) {
      (void)!write(STDERR_FILENO, g.message.load(std::memory_order_relaxed), g.length.load(std::memory_order_relaxed));
      _exit(kExitBadInput);
    }
  }
  // Not one of ours: the disposition we replaced takes it. A fault returns to the access, which faults again and
  // reaches it; a SIGBUS sent by kill(2) is raised again, pending until this handler returns.
  sigaction(SIGBUS, &g_previous_sigbus, nullptr);
  if (info->si_code <= 0) raise(SIGBUS);
}

void install_sigbus_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGBUS, &sa, &g_previous_sigbus);
}

// Registers [data, data + size) under `path`; returns the slot, or -1 when all are taken (the mapping then keeps
// the default SIGBUS behaviour).
int guard(const uint8_t* data, int64_t size, const std::string& path) {
  static std::once_flag installed;
  std::call_once(installed, install_sigbus_handler);
  for (int i = 0; i < kMaxGuardedMappings; ++i) {
    GuardedMapping& g = g_guarded[i];
    bool expected = false;
    if (!g.taken.compare_exchange_strong(expected, true)) continue;
    const std::string text = str_cat("error: ", process_prefix(), " data file ", excerpt(path, kExcerptPathChars),
                                     " changed while the job was reading it (a read of its memory mapping failed "
                                     "with SIGBUS: the file was truncated or rewritten in place); data files must "
                                     "not change while a job reads them\n");
    char* message = new char[text.size()];
    std::memcpy(message, text.data(), text.size());
    g.message.store(message, std::memory_order_relaxed);
    g.length.store(text.size(), std::memory_order_relaxed);
    g.end.store(reinterpret_cast<uintptr_t>(data) + static_cast<uintptr_t>(size), std::memory_order_relaxed);
    g.begin.store(reinterpret_cast<uintptr_t>(data), std::memory_order_release);
    return i;
  }
  return -1;
}

void unguard(int slot) {
  if (slot < 0) return;
  GuardedMapping& g = g_guarded[slot];
  g.begin.store(0, std::memory_order_release);
  delete[] g.message.exchange(nullptr, std::memory_order_relaxed);
  g.taken.store(false, std::memory_order_release);
}

}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // Closed when the constructor returns: the mapping keeps its own reference to the file.
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) ST_BAD_INPUT("data file ", path, ": cannot open: ", errno_text());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) ST_BAD_INPUT("data file ", path, ": cannot stat: ", errno_text());
  if (!S_ISREG(st.st_mode)) ST_BAD_INPUT("data file ", path, ": not a regular file");
  size_ = static_cast<int64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (p == MAP_FAILED) ST_FAULT("data file ", path, ": mmap of ", size_, " bytes failed: ", errno_text());
    data_ = static_cast<const uint8_t*>(p);
    guard_slot_ = guard(data_, size_, path_);
  }
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      guard_slot_(std::exchange(other.guard_slot_, -1)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    guard_slot_ = std::exchange(other.guard_slot_, -1);
  }
  return *this;
}

void MappedFile::release() noexcept {
  unguard(std::exchange(guard_slot_, -1));
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_));
  data_ = nullptr;
  size_ = 0;
}

}  // namespace st
