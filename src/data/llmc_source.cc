#include "shardtrain/data/llmc_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "shardtrain/core/error.h"
#include "shardtrain/core/log.h"
#include "shardtrain/data/path_glob.h"

namespace st {
namespace {

int32_t header_int(const MappedFile& f, int64_t index) {
  int32_t v;
  std::memcpy(&v, f.data() + 4 * index, sizeof(v));
  return v;
}

// Checks one shard's header and size; returns its token count. Every message names the file and the
// byte offset it is about.
int64_t check_llmc_header(const MappedFile& f) {
  const std::string& path = f.path();
  if (f.size() == 0) ST_BAD_INPUT("llm.c data file ", path, " is empty (0 bytes)");
  if (f.size() < kLlmcHeaderBytes) {
    ST_BAD_INPUT("llm.c data file ", path, " is ", f.size(), " bytes, shorter than the ", kLlmcHeaderBytes,
                 "-byte header (it ends at byte ", f.size(), ")");
  }
  const int32_t magic = header_int(f, 0);
  if (magic != kLlmcMagic) {
    ST_BAD_INPUT("llm.c data file ", path, ": bad magic at byte 0: expected ", kLlmcMagic, ", got ", magic,
                 " (is this an llm.c .bin shard? for raw text set data.format=text)");
  }
  const int32_t version = header_int(f, 1);
  if (version != kLlmcVersion) {
    ST_BAD_INPUT("llm.c data file ", path, ": unsupported version at byte 4: expected ", kLlmcVersion,
                 " (uint16 tokens), got ", version);
  }
  const int64_t n = header_int(f, 2);
  if (n < 0) ST_BAD_INPUT("llm.c data file ", path, ": negative token count ", n, " in the header at byte 8");
  if (n == 0) ST_BAD_INPUT("llm.c data file ", path, " is empty: the header at byte 8 says 0 tokens");
  const int64_t payload = f.size() - kLlmcHeaderBytes;
  const int64_t expected_size = kLlmcHeaderBytes + 2 * n;
  if (f.size() < expected_size) {
    ST_BAD_INPUT("llm.c data file ", path, " is truncated: the header at byte 8 says ", n, " tokens, i.e. bytes [",
                 kLlmcHeaderBytes, ", ", expected_size, "), but the file is ", f.size(), " bytes: room for ",
                 payload / 2, " tokens");
  }
  if (f.size() > expected_size) {
    ST_BAD_INPUT("llm.c data file ", path, " has ", f.size() - expected_size,
                 " trailing bytes: the header at byte 8 says ", n, " tokens, so the file should end at byte ",
                 expected_size, ", but it is ", f.size(), " bytes");
  }
  return n;
}

// A file descriptor that closes itself.
class Fd {
 public:
  explicit Fd(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) ST_BAD_INPUT("data file ", path, ": cannot open: ", std::strerror(errno));
  }
  ~Fd() { ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Reads exactly `bytes` bytes at `offset` (pread may return short counts).
bool pread_all(int fd, void* buf, int64_t bytes, int64_t offset) {
  auto* p = static_cast<char*>(buf);
  while (bytes > 0) {
    const ssize_t r = ::pread(fd, p, static_cast<size_t>(bytes), offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    bytes -= r;
    offset += r;
  }
  return true;
}

// Index of the first token >= lim in p[0, n), or -1; the per-chunk body of both scans.
int64_t first_in_chunk(const uint16_t* p, int64_t n, uint16_t lim) {
  uint16_t mx = 0;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, p[i]);  // vectorises: the common, clean case
  if (mx < lim) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] >= lim) return i;
  }
  return -1;
}

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

}  // namespace

int64_t find_first_token_at_least(const uint16_t* p, int64_t n, int64_t limit) {
  if (limit > std::numeric_limits<uint16_t>::max()) return -1;
  if (limit <= 0) return n > 0 ? 0 : -1;
  const uint16_t lim = static_cast<uint16_t>(limit);
  // Chunks of 64 Ki tokens: big enough that the per-chunk max loop vectorises and runs at bandwidth,
  // small enough that a few thousand of them balance over the threads of a multi-GB shard.
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  int64_t first = kNone;
#pragma omp parallel for schedule(static) reduction(min : first)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t lo = c * kChunk;
    const int64_t i = first_in_chunk(p + lo, std::min(n, lo + kChunk) - lo, lim);
    if (i >= 0) first = std::min(first, lo + i);
  }
  return first == kNone ? -1 : first;
}

int64_t find_first_token_at_least_in_file(const std::string& path, int64_t byte_offset, int64_t n, int64_t limit) {
  if (limit > std::numeric_limits<uint16_t>::max() || n <= 0) return -1;
  if (limit <= 0) return 0;
  const uint16_t lim = static_cast<uint16_t>(limit);
  const Fd fd(path);
  // 512 Ki tokens (1 MiB) per chunk: large enough to amortise the syscall, small enough to stay in L2
  // while it is scanned and to balance a multi-GB file over the threads.
  constexpr int64_t kChunk = int64_t{1} << 19;
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  int64_t first = kNone;
  bool io_error = false;
#pragma omp parallel reduction(min : first) reduction(|| : io_error)
  {
    std::vector<uint16_t> buf(static_cast<size_t>(std::min(n, kChunk)));
#pragma omp for schedule(static)
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t lo = c * kChunk;
      const int64_t count = std::min(n, lo + kChunk) - lo;
      if (!pread_all(fd.get(), buf.data(), 2 * count, byte_offset + 2 * lo)) {
        io_error = true;
        continue;
      }
      const int64_t i = first_in_chunk(buf.data(), count, lim);
      if (i >= 0) first = std::min(first, lo + i);
    }
  }
  if (io_error) ST_FAULT("data file ", path, ": read error while validating its ", n, " tokens");
  return first == kNone ? -1 : first;
}

std::unique_ptr<FileTokenSource> open_llmc_source(const std::string& path, int vocab_size, const std::string& key) {
  if (vocab_size <= 0) ST_BAD_INPUT("model.vocab_size must be > 0, got ", vocab_size);
  const std::vector<std::string> paths = expand_data_path(path, key);
  std::vector<FilePayload> files;
  files.reserve(paths.size());
  int64_t total = 0;
  for (const std::string& p : paths) {
    MappedFile f(p);
    const int64_t n = check_llmc_header(f);
    const int64_t bad = find_first_token_at_least_in_file(p, kLlmcHeaderBytes, n, vocab_size);
    if (bad >= 0) {
      uint16_t token;
      std::memcpy(&token, f.data() + kLlmcHeaderBytes + 2 * bad, sizeof(token));
      ST_BAD_INPUT("llm.c data file ", p, ": token ", token, " at byte ", kLlmcHeaderBytes + 2 * bad, " (token index ",
                   bad, ") is >= model.vocab_size ", vocab_size);
    }
    files.push_back(FilePayload{std::move(f), kLlmcHeaderBytes, n});
    total += n;
  }
  std::string description = str_cat("llm.c shards '", path, "' (", paths.size(),
                                    paths.size() == 1 ? " file, " : " files, ", total, " tokens)");
  ST_LOG_INFO("data: ", description);
  return std::make_unique<FileTokenSource>(std::move(files), TokenWidth::kU16, vocab_size, std::move(description));
}

}  // namespace st
