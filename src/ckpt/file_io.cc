#include "shardtrain/ckpt/file_io.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/unique_fd.h"

namespace st {
namespace {

std::string parent_dir(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

std::string openssl_error() {
  const unsigned long code = ERR_get_error();
  if (code == 0) return "no OpenSSL error queued";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return buf;
}

struct EvpCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using EvpCtx = std::unique_ptr<EVP_MD_CTX, EvpCtxFree>;

EvpCtx sha256_begin() {
  EvpCtx ctx(EVP_MD_CTX_new());
  ST_CHECK(ctx != nullptr, "EVP_MD_CTX_new: ", openssl_error());
  ST_CHECK(EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, "EVP_DigestInit_ex: ", openssl_error());
  return ctx;
}

void sha256_update(EVP_MD_CTX* ctx, const void* data, size_t bytes) {
  ST_CHECK(EVP_DigestUpdate(ctx, data, bytes) == 1, "EVP_DigestUpdate: ", openssl_error());
}

using Digest = std::array<unsigned char, 32>;

Digest sha256_final(EVP_MD_CTX* ctx) {
  Digest digest;
  unsigned int len = 0;
  ST_CHECK(EVP_DigestFinal_ex(ctx, digest.data(), &len) == 1 && len == digest.size(),
           "EVP_DigestFinal_ex: ", openssl_error());
  return digest;
}

std::string hex_of(const Digest& digest) {
  static const char kHex[] = "0123456789abcdef";
  std::string out(2 * digest.size(), '0');
  for (size_t i = 0; i < digest.size(); ++i) {
    out[2 * i] = kHex[digest[i] >> 4];
    out[2 * i + 1] = kHex[digest[i] & 0xf];
  }
  return out;
}

std::string sha256_end(EVP_MD_CTX* ctx) { return hex_of(sha256_final(ctx)); }

// The digest of a file cut into pieces: the SHA-256 of the pieces' SHA-256s in order.
std::string root_of(const std::vector<Digest>& pieces) {
  EvpCtx ctx = sha256_begin();
  for (const Digest& d : pieces) sha256_update(ctx.get(), d.data(), d.size());
  return sha256_end(ctx.get());
}

// Calls fn(thread, i) for every i in [0, count), on min(threads, count) threads numbered from 0 (the calling thread
// is thread 0), each taking the next i when done with one. fn returns false to stop every thread at its next i.
// The first exception stops them the same way and is rethrown here once all have ended.
template <class Fn>
void for_each_index(int64_t count, int threads, Fn fn) {
  std::atomic<int64_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::exception_ptr error;
  auto work = [&](int thread) {
    try {
      while (!stop) {
        const int64_t i = next++;
        if (i >= count) return;
        if (!fn(thread, i)) break;
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
    }
    stop = true;  // fn said stop, or threw
  };
  const int n = static_cast<int>(std::min<int64_t>(count, threads));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work, t);
  if (n > 0) work(0);
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// Bytes per read and write of a large file, and the writes in flight: 16 MiB x 4 wrote as fast as any size and
// count measured (docs/performance.md, "Checkpoint writes and loads"), and 64 MiB is all the memory a write holds.
constexpr size_t kIoBytes = size_t{16} << 20;
constexpr int kWritesInFlight = 4;
// Threads that hash a file's digest pieces from memory: four compute SHA-256 at four times one core's speed, faster
// than the disks the pieces are written to.
constexpr int kDigestThreads = 4;
// Threads that copy a range of a file in the page cache into memory (read_at).
constexpr int kCopyThreads = 4;
// A pass over a whole file (digest_and_read) reads it in order, one 64 MiB read at a time, as `dd bs=64M` does:
// on the disks measured this reads a cold file as fast as anything tried, and faster than several reads in flight
// at different offsets, which break up the kernel's read-ahead (docs/performance.md, "Checkpoint writes and loads").
constexpr size_t kPassReadBytes = size_t{64} << 20;
// Reads of a pass held in memory at once: one being read while the threads hash and copy the others.
constexpr int kPassReads = 3;
// kIoBytes buffers kept mapped between calls: a pass's reads.
constexpr int kPooledBuffers = kPassReads * static_cast<int>(kPassReadBytes / kIoBytes);
// O_DIRECT needs buffers, offsets and lengths aligned to the device's logical block: 4096 covers 512-byte
// and 4 KiB devices alike.
constexpr size_t kDirectAlign = 4096;

// Page-aligned anonymous memory (so O_DIRECT can use it), mapped with its pages present (MAP_POPULATE): one
// system call instead of a page fault per 4 KiB on first touch.
class IoBuffer {
 public:
  explicit IoBuffer(size_t bytes) : bytes_(std::max<size_t>(bytes, 1)) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<char*>(p);
  }
  IoBuffer(IoBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
  IoBuffer& operator=(IoBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  IoBuffer(const IoBuffer&) = delete;
  IoBuffer& operator=(const IoBuffer&) = delete;
  ~IoBuffer() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  char* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  char* data_ = nullptr;
  size_t bytes_ = 0;
};

// kIoBytes buffers for large files, kept for the process's next call (a run saves every ckpt.every steps and
// loads at start-up): mapping 64 MiB again each time is slow on a busy machine (docs/performance.md, "Checkpoint
// writes and loads"). At most kPooledBuffers buffers (192 MiB) stay mapped. Smaller files get buffers of their own
// size.
class IoBuffers {
 public:
  IoBuffers(int count, size_t bytes) : pooled_(bytes >= kIoBytes) {
    if (pooled_) {
      std::lock_guard<std::mutex> lock(pool_mu());
      std::vector<IoBuffer>& pool = this->pool();
      while (!pool.empty() && static_cast<int>(buffers_.size()) < count) {
        buffers_.push_back(std::move(pool.back()));
        pool.pop_back();
      }
    }
    while (static_cast<int>(buffers_.size()) < count) buffers_.emplace_back(pooled_ ? kIoBytes : bytes);
  }
  IoBuffers(const IoBuffers&) = delete;
  IoBuffers& operator=(const IoBuffers&) = delete;
  ~IoBuffers() {
    if (!pooled_) return;
    std::lock_guard<std::mutex> lock(pool_mu());
    for (IoBuffer& b : buffers_)
      if (static_cast<int>(pool().size()) < kPooledBuffers) pool().push_back(std::move(b));
  }
  char* operator[](size_t i) const { return buffers_[i].data(); }
  size_t count() const { return buffers_.size(); }

 private:
  static std::mutex& pool_mu() {
    static std::mutex mu;
    return mu;
  }
  static std::vector<IoBuffer>& pool() {
    static std::vector<IoBuffer> buffers;
    return buffers;
  }

  bool pooled_;
  std::vector<IoBuffer> buffers_;
};

// A file's bytes as runs of memory, back to back from offset 0.
class Runs {
 public:
  void add(const void* data, int64_t bytes) {
    if (bytes == 0) return;
    data_.push_back(static_cast<const char*>(data));
    starts_.push_back(total_);
    total_ += bytes;
  }
  int64_t total() const { return total_; }
  // Copies file bytes [offset, offset + n) into out.
  void gather(int64_t offset, size_t n, char* out) const {
    for_each_span(offset, offset + static_cast<int64_t>(n), [&out](const char* p, size_t k) {
      std::memcpy(out, p, k);
      out += k;
    });
  }
  // Calls fn(data, n) on file bytes [begin, end) in order, one call per run they touch.
  template <class Fn>
  void for_each_span(int64_t begin, int64_t end, Fn fn) const {
    if (begin >= end) return;
    size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin()) - 1;
    for (; i < data_.size() && starts_[i] < end; ++i) {
      const int64_t run_end = i + 1 < starts_.size() ? starts_[i + 1] : total_;
      const int64_t from = std::max(begin, starts_[i]), to = std::min(end, run_end);
      fn(data_[i] + (from - starts_[i]), static_cast<size_t>(to - from));
    }
  }

 private:
  std::vector<const char*> data_;
  std::vector<int64_t> starts_;
  int64_t total_ = 0;
};

// The first failed system call of a write: errno and the file offset it failed at.
struct WriteFailure {
  int err = 0;
  int64_t offset = 0;
  bool failed() const { return err != 0; }
};

// pwrite(2) of all n bytes at `offset`, resuming after short writes. A write that makes no progress is
// reported as ENOSPC, which is what it means on a regular file.
WriteFailure pwrite_all(int fd, const char* buf, size_t n, int64_t offset) {
  size_t done = 0;
  while (done < n) {
    const ssize_t w = ::pwrite(fd, buf + done, n - done, offset + static_cast<int64_t>(done));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return {w < 0 ? errno : ENOSPC, offset + static_cast<int64_t>(done)};
    done += static_cast<size_t>(w);
  }
  return {};
}

// Writes file bytes [begin, end) through fd in kIoBytes pieces, one thread per buffer, each gathering its
// piece from `runs` into its own buffer (aligned, so that fd may be O_DIRECT). Returns the first failure;
// the other threads stop at their next piece.
WriteFailure write_pieces(int fd, const Runs& runs, int64_t begin, int64_t end, const IoBuffers& buffers) {
  const int64_t pieces = (end - begin + static_cast<int64_t>(kIoBytes) - 1) / static_cast<int64_t>(kIoBytes);
  std::mutex mu;
  WriteFailure first;
  for_each_index(pieces, static_cast<int>(buffers.count()), [&](int thread, int64_t i) {
    char* buf = buffers[static_cast<size_t>(thread)];
    const int64_t offset = begin + i * static_cast<int64_t>(kIoBytes);
    const size_t n = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(kIoBytes), end - offset));
    runs.gather(offset, n, buf);
    const WriteFailure f = pwrite_all(fd, buf, n, offset);
    if (!f.failed()) return true;
    std::lock_guard<std::mutex> lock(mu);
    if (!first.failed()) first = f;
    return false;
  });
  return first;
}

// The digest (file_digest's) of `runs`, its pieces hashed on kDigestThreads threads. Returns "" once *cancel is set.
std::string digest_runs(const Runs& runs, int64_t piece_bytes, const std::atomic<bool>& cancel) {
  if (piece_bytes == 0) {
    EvpCtx ctx = sha256_begin();
    runs.for_each_span(0, runs.total(), [&](const char* p, size_t n) { sha256_update(ctx.get(), p, n); });
    return sha256_end(ctx.get());
  }
  std::vector<Digest> digests(static_cast<size_t>((runs.total() + piece_bytes - 1) / piece_bytes));
  for_each_index(static_cast<int64_t>(digests.size()), kDigestThreads, [&](int, int64_t i) {
    if (cancel) return false;
    EvpCtx ctx = sha256_begin();
    runs.for_each_span(i * piece_bytes, std::min(runs.total(), (i + 1) * piece_bytes),
                       [&](const char* p, size_t n) { sha256_update(ctx.get(), p, n); });
    digests[static_cast<size_t>(i)] = sha256_final(ctx.get());
    return true;
  });
  return cancel ? std::string() : root_of(digests);
}

// The digest of `runs`, computed on threads of its own. Destroyed before result(), it stops early.
class BackgroundDigest {
 public:
  BackgroundDigest(const Runs& runs, int64_t piece_bytes)
      : thread_([this, &runs, piece_bytes] { run(runs, piece_bytes); }) {}
  BackgroundDigest(const BackgroundDigest&) = delete;
  BackgroundDigest& operator=(const BackgroundDigest&) = delete;
  ~BackgroundDigest() {
    if (!thread_.joinable()) return;
    cancel_ = true;
    thread_.join();
  }
  // Waits for the digest; rethrows what it threw.
  std::string result() {
    thread_.join();
    if (error_) std::rethrow_exception(error_);
    return digest_;
  }

 private:
  void run(const Runs& runs, int64_t piece_bytes) {
    try {
      digest_ = digest_runs(runs, piece_bytes, cancel_);
    } catch (...) {
      error_ = std::current_exception();
    }
  }

  std::atomic<bool> cancel_{false};
  std::string digest_;
  std::exception_ptr error_;
  std::thread thread_;  // last: it starts once the members above exist
};

// preadv(2) of exactly n bytes at `offset` into consecutive buffers of buf_bytes each, resuming after short reads. A
// failing read is kFault naming the path and the byte; so is an earlier end of the file (it shrank while read).
void preadv_exact(int fd, const std::string& path, char* const* bufs, size_t buf_bytes, size_t n, int64_t offset) {
  std::vector<iovec> iov;
  size_t got = 0;
  while (got < n) {
    iov.clear();
    for (size_t at = got; at < n;) {
      const size_t in_buf = at % buf_bytes, take = std::min(buf_bytes - in_buf, n - at);
      iov.push_back(iovec{bufs[at / buf_bytes] + in_buf, take});
      at += take;
    }
    const ssize_t r = ::preadv(fd, iov.data(), static_cast<int>(std::min<size_t>(iov.size(), IOV_MAX)),
                               offset + static_cast<int64_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) ST_FAULT("read of ", path, " at byte ", offset + static_cast<int64_t>(got), " failed: ", errno_text());
    if (r == 0) ST_FAULT("read of ", path, " at byte ", offset + static_cast<int64_t>(got), ": the file ended early");
    got += static_cast<size_t>(r);
  }
}

// preadv_exact into one buffer.
void pread_exact(int fd, const std::string& path, char* buf, size_t n, int64_t offset) {
  preadv_exact(fd, path, &buf, n, n, offset);
}

// One pass over a whole file for digest_and_read. The calling thread reads the file in order, kPassReadBytes per
// read, into one of kPassReads slots; kDigestThreads threads hash and copy each read's bytes while the next ones
// are read, and hand the slot back when done.
//
// Hashing: pieces are dealt to the threads in stripes of about kIoBytes (whole pieces, consecutive), stripe s to
// thread s % kDigestThreads. A thread gets the bytes of its stripes in file order, so it hashes one piece at a time,
// and a piece longer than a read (or the whole file, when piece_bytes is 0) is hashed across reads by one thread.
// Copying: each buffer's share of the `wanted` ranges is copied by one thread, the buffers dealt round robin.
class FilePass {
 public:
  FilePass(const std::string& path, int fd, int64_t size, int64_t piece_bytes, const std::vector<WantedBytes>& wanted)
      : path_(path),
        fd_(fd),
        size_(size),
        piece_bytes_(piece_bytes > 0 ? piece_bytes : size),
        stripe_(piece_bytes > 0 ? piece_bytes * std::max<int64_t>(1, static_cast<int64_t>(kIoBytes) / piece_bytes)
                                : size),
        wanted_(wanted),
        buf_bytes_(static_cast<size_t>(std::min<int64_t>(size, static_cast<int64_t>(kIoBytes)))),
        bufs_per_read_(static_cast<int>(
            (std::min<int64_t>(size, static_cast<int64_t>(kPassReadBytes)) + static_cast<int64_t>(buf_bytes_) - 1) /
            static_cast<int64_t>(buf_bytes_))),
        read_bytes_(static_cast<int64_t>(buf_bytes_) * bufs_per_read_),
        reads_((size + read_bytes_ - 1) / read_bytes_),
        slots_(static_cast<int>(std::min<int64_t>(reads_, kPassReads))),
        buffers_(slots_ * bufs_per_read_, buf_bytes_),
        digests_(static_cast<size_t>((size + piece_bytes_ - 1) / piece_bytes_)),
        slot_bytes_(static_cast<size_t>(slots_)),
        queues_(kDigestThreads),
        pending_(static_cast<size_t>(slots_), 0),
        read_at_(static_cast<size_t>(slots_), 0) {
    for (int s = slots_ - 1; s >= 0; --s) {
      for (int b = 0; b < bufs_per_read_; ++b)
        slot_bytes_[static_cast<size_t>(s)].add(buffer(s, b), static_cast<int64_t>(buf_bytes_));
      free_.push_back(s);
    }
  }

  // Reads the file and returns its pieces' digests in order (one, the whole file's, when piece_bytes is 0).
  std::vector<Digest> run() {
    std::vector<std::thread> threads;
    for (int t = 0; t < kDigestThreads; ++t) threads.emplace_back([this, t] { work(t); });
    try {
      read_all();
    } catch (...) {
      fail(std::current_exception());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    work_cv_.notify_all();
    for (std::thread& t : threads) t.join();
    if (error_) std::rethrow_exception(error_);
    return std::move(digests_);
  }

 private:
  struct Task {
    int slot = 0;
    int64_t begin = 0, end = 0;  // file bytes, inside the slot's read
    bool copy = false;           // copy the wanted bytes; else hash
  };

  void read_all() {
    std::vector<char*> bufs(static_cast<size_t>(bufs_per_read_));
    for (int64_t r = 0; r < reads_; ++r) {
      int slot = 0;
      {
        std::unique_lock<std::mutex> lock(mu_);
        slot_cv_.wait(lock, [&] { return failed_ || !free_.empty(); });
        if (failed_) return;
        slot = free_.back();
        free_.pop_back();
      }
      const int64_t begin = r * read_bytes_, end = std::min(size_, begin + read_bytes_);
      for (int b = 0; b < bufs_per_read_; ++b) bufs[static_cast<size_t>(b)] = buffer(slot, b);
      preadv_exact(fd_, path_, bufs.data(), buf_bytes_, static_cast<size_t>(end - begin), begin);
      std::vector<std::pair<int, Task>> tasks;
      for (int64_t s = begin / stripe_; s * stripe_ < end; ++s)
        tasks.push_back({static_cast<int>(s % kDigestThreads),
                         Task{slot, std::max(begin, s * stripe_), std::min(end, (s + 1) * stripe_), false}});
      if (!wanted_.empty())
        for (int64_t at = begin; at < end; at += static_cast<int64_t>(buf_bytes_))
          tasks.push_back({static_cast<int>((at / static_cast<int64_t>(buf_bytes_)) % kDigestThreads),
                           Task{slot, at, std::min(end, at + static_cast<int64_t>(buf_bytes_)), true}});
      {
        std::lock_guard<std::mutex> lock(mu_);
        read_at_[static_cast<size_t>(slot)] = begin;
        pending_[static_cast<size_t>(slot)] = static_cast<int>(tasks.size());
        for (const auto& [thread, task] : tasks) queues_[static_cast<size_t>(thread)].push_back(task);
      }
      work_cv_.notify_all();
    }
  }

  void work(int thread) {
    EvpCtx ctx;  // the piece this thread is in the middle of, if any
    std::deque<Task>& queue = queues_[static_cast<size_t>(thread)];
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return failed_ || done_ || !queue.empty(); });
        if (failed_ || queue.empty()) return;  // failed, or done with nothing left
        task = queue.front();
        queue.pop_front();
      }
      try {
        if (task.copy)
          copy(task);
        else
          hash(task, ctx);
      } catch (...) {
        fail(std::current_exception());
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (--pending_[static_cast<size_t>(task.slot)] == 0) free_.push_back(task.slot);
      }
      slot_cv_.notify_one();
    }
  }

  // Calls fn(data, n) on file bytes [begin, end) of a slot's read, one call per buffer they touch.
  template <class Fn>
  void for_each_span(const Task& t, int64_t begin, int64_t end, Fn fn) const {
    const int64_t base = read_at_[static_cast<size_t>(t.slot)];
    slot_bytes_[static_cast<size_t>(t.slot)].for_each_span(begin - base, end - base, fn);
  }

  void hash(const Task& t, EvpCtx& ctx) {
    for (int64_t at = t.begin; at < t.end;) {
      const int64_t piece = at / piece_bytes_, piece_end = std::min(size_, (piece + 1) * piece_bytes_);
      const int64_t to = std::min(t.end, piece_end);
      if (!ctx) ctx = sha256_begin();
      for_each_span(t, at, to, [&](const char* p, size_t n) { sha256_update(ctx.get(), p, n); });
      at = to;
      if (at == piece_end) {
        digests_[static_cast<size_t>(piece)] = sha256_final(ctx.get());
        ctx.reset();
      }
    }
  }

  void copy(const Task& t) const {
    for (const WantedBytes& w : wanted_) {
      const int64_t from = std::max(t.begin, w.offset), to = std::min(t.end, w.offset + w.bytes);
      char* out = static_cast<char*>(w.out) + (from - w.offset);
      for_each_span(t, from, to, [&out](const char* p, size_t n) {
        std::memcpy(out, p, n);
        out += n;
      });
    }
  }

  char* buffer(int slot, int b) const { return buffers_[static_cast<size_t>(slot * bufs_per_read_ + b)]; }

  void fail(std::exception_ptr e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::move(e);
      failed_ = true;
    }
    work_cv_.notify_all();
    slot_cv_.notify_all();
  }

  const std::string& path_;
  const int fd_;
  const int64_t size_, piece_bytes_, stripe_;
  const std::vector<WantedBytes>& wanted_;
  const size_t buf_bytes_;
  const int bufs_per_read_;
  const int64_t read_bytes_, reads_;
  const int slots_;
  const IoBuffers buffers_;
  std::vector<Digest> digests_;
  std::vector<Runs> slot_bytes_;  // per slot: its buffers, back to back

  std::mutex mu_;  // guards everything below
  std::condition_variable work_cv_, slot_cv_;
  std::vector<std::deque<Task>> queues_;  // per thread
  std::vector<int> pending_;              // per slot: tasks not yet done
  std::vector<int64_t> read_at_;          // per slot: the file offset of its read
  std::vector<int> free_;
  bool done_ = false, failed_ = false;
  std::exception_ptr error_;
};

}  // namespace

RemoveOnFailure::~RemoveOnFailure() {
  std::error_code ec;  // a destructor reports nothing: what cannot be removed stays
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

void check_output_dir(const std::string& path, const std::string& what) {
  const std::string dir = parent_dir(path);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) ST_BAD_INPUT(what, " ", path, ": output directory ", dir, " does not exist");
    // ENOTDIR: a component above dir is a file.
    ST_BAD_INPUT(what, " ", path, ": output directory ", dir, " cannot be used: ", errno_text(err));
  }
  if (!S_ISDIR(st.st_mode))
    ST_BAD_INPUT(what, " ", path, ": ", dir,
                 S_ISREG(st.st_mode) ? " is a file, not a directory" : " is not a directory");
}

void fsync_path(const std::string& path) {
  // O_RDONLY works for directories too; fsync on a read-only descriptor flushes the whole inode.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) ST_FAULT("cannot open ", path, " to fsync it: ", errno_text());
  while (::fsync(fd.get()) != 0) {
    if (errno != EINTR) ST_FAULT("fsync of ", path, " failed: ", errno_text());
  }
  if (fd.close() != 0) ST_FAULT("close of ", path, " after fsync failed: ", errno_text());
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  RemoveOnFailure cleanup(tmp);
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) ST_FAULT("cannot create ", tmp, ": ", errno_text());
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) ST_FAULT("write to ", tmp, " failed after ", done, " of ", text.size(), " bytes: ", errno_text());
      done += static_cast<size_t>(n);
    }
    while (::fsync(fd.get()) != 0) {
      if (errno != EINTR) ST_FAULT("fsync of ", tmp, " failed: ", errno_text());
    }
    if (fd.close() != 0) ST_FAULT("close of ", tmp, " failed: ", errno_text());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) ST_FAULT("cannot rename ", tmp, " to ", path, ": ", errno_text());
  cleanup.dismiss();
  // The rename is durable only once the directory entry is.
  fsync_path(parent_dir(path));
}

std::string read_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) ST_BAD_INPUT("cannot read ", path, ": ", errno_text());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) ST_BAD_INPUT("cannot stat ", path, ": ", errno_text());
  if (S_ISDIR(st.st_mode)) ST_BAD_INPUT("cannot read ", path, ": it is a directory");
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ST_BAD_INPUT("cannot read ", path, " after ", out.size(), " bytes: ", errno_text());
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

int64_t file_size(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t n = std::filesystem::file_size(path, ec);
  if (ec) ST_BAD_INPUT("cannot get the size of ", path, ": ", ec.message());
  return static_cast<int64_t>(n);
}

std::string sha256_file(const std::string& path) { return digest_and_read(path, 0, {}); }

std::string sha256_hex(const void* data, size_t bytes) {
  EvpCtx ctx = sha256_begin();
  sha256_update(ctx.get(), data, bytes);
  return sha256_end(ctx.get());
}

std::string digest_hex(const void* data, size_t bytes, int64_t piece_bytes) {
  ST_CHECK(piece_bytes >= 0, "digest piece size ", piece_bytes);
  Runs runs;
  runs.add(data, static_cast<int64_t>(bytes));
  const std::atomic<bool> never{false};
  return digest_runs(runs, piece_bytes, never);
}

std::string file_digest(const std::string& path, int64_t piece_bytes) { return digest_and_read(path, piece_bytes, {}); }

std::string digest_and_read(const std::string& path, int64_t piece_bytes, const std::vector<WantedBytes>& wanted) {
  ST_CHECK(piece_bytes >= 0, "digest piece size ", piece_bytes);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) ST_BAD_INPUT("cannot read ", path, " to hash it: ", errno_text());
  (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);  // doubles the kernel's read-ahead window
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) ST_FAULT("cannot stat ", path, ": ", errno_text());
  const int64_t size = static_cast<int64_t>(st.st_size);
  for (const WantedBytes& w : wanted)
    if (w.offset < 0 || w.bytes < 0 || w.offset > size - w.bytes)
      ST_BAD_INPUT(path, ": bytes [", w.offset, ", ", w.offset + w.bytes, ") are wanted from a file of ", size,
                   " bytes");
  if (size == 0) return piece_bytes > 0 ? root_of({}) : sha256_hex(nullptr, 0);
  const std::vector<Digest> digests = FilePass(path, fd.get(), size, piece_bytes, wanted).run();
  return piece_bytes > 0 ? root_of(digests) : hex_of(digests[0]);
}

void read_at(int fd, const std::string& path, int64_t offset, int64_t bytes, void* out) {
  const int64_t step = static_cast<int64_t>(kIoBytes);
  for_each_index((bytes + step - 1) / step, kCopyThreads, [&](int, int64_t i) {
    char* to = static_cast<char*>(out) + i * step;
    const int64_t at = offset + i * step;
    const size_t n = static_cast<size_t>(std::min(step, bytes - i * step));
    pread_exact(fd, path, to, n, at);
    return true;
  });
}

struct DigestStream::Ctx {
  int64_t piece_bytes = 0;
  int64_t in_piece = 0;           // bytes in the current piece so far
  EvpCtx piece = sha256_begin();  // the current piece's hash (the whole stream's when piece_bytes == 0)
  EvpCtx root = sha256_begin();   // the pieces' digests so far
  void end_piece() {
    const Digest d = sha256_final(piece.get());
    sha256_update(root.get(), d.data(), d.size());
    piece = sha256_begin();
    in_piece = 0;
  }
};

DigestStream::DigestStream(int64_t piece_bytes) : ctx_(std::make_unique<Ctx>()) {
  ST_CHECK(piece_bytes >= 0, "digest piece size ", piece_bytes);
  ctx_->piece_bytes = piece_bytes;
}
DigestStream::~DigestStream() = default;

void DigestStream::update(const void* data, size_t bytes) {
  Ctx& c = *ctx_;
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const size_t take = c.piece_bytes == 0 ? bytes : std::min(bytes, static_cast<size_t>(c.piece_bytes - c.in_piece));
    sha256_update(c.piece.get(), p, take);
    c.in_piece += static_cast<int64_t>(take);
    p += take;
    bytes -= take;
    if (c.piece_bytes > 0 && c.in_piece == c.piece_bytes) c.end_piece();
  }
}

std::string DigestStream::hex() {
  Ctx& c = *ctx_;
  if (c.piece_bytes == 0) return sha256_end(c.piece.get());
  if (c.in_piece > 0) c.end_piece();
  return sha256_end(c.root.get());
}

WrittenFile overwrite_file(const std::string& path, std::vector<PlacedBytes> pieces, int64_t piece_bytes) {
  ST_CHECK(piece_bytes > 0, path, ": digest piece size ", piece_bytes);
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (fd.get() < 0) ST_FAULT("cannot open ", path, " to write it: ", errno_text());
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) ST_FAULT("cannot stat ", path, ": ", errno_text());
  const int64_t total = static_cast<int64_t>(st.st_size);

  // The file as runs of memory: each piece, and between them the bytes the file already holds.
  pieces.erase(std::remove_if(pieces.begin(), pieces.end(), [](const PlacedBytes& p) { return p.bytes == 0; }),
               pieces.end());
  std::sort(pieces.begin(), pieces.end(),
            [](const PlacedBytes& a, const PlacedBytes& b) { return a.offset < b.offset; });
  std::vector<std::string> kept;
  kept.reserve(pieces.size() + 1);  // no reallocation: the runs point into these strings
  Runs runs;
  int64_t at = 0;
  auto keep_until = [&](int64_t end) {
    if (end <= at) return;
    kept.emplace_back(static_cast<size_t>(end - at), '\0');
    pread_exact(fd.get(), path, kept.back().data(), kept.back().size(), at);
    runs.add(kept.back().data(), end - at);
  };
  for (const PlacedBytes& p : pieces) {
    ST_CHECK(p.bytes > 0 && p.offset >= at && p.offset <= total - p.bytes && p.data != nullptr, path, ": ", p.bytes,
             " bytes at ", p.offset, " overlap the previous piece (ending at ", at, ") or pass the end of the ", total,
             "-byte file");
    keep_until(p.offset);
    runs.add(p.data, p.bytes);
    at = p.offset + p.bytes;
  }
  keep_until(total);
  // The blocks are reserved in one call first, so that the file system lays them out in order: concurrent writes
  // into holes would allocate each 16 MiB piece where its write lands first, and the file would be read back in
  // scattered extents. A full disk shows here, before anything is written. File systems without fallocate
  // (EOPNOTSUPP) just skip it.
  if (total > 0) {
    int err = 0;
    do {
      err = ::fallocate(fd.get(), 0, 0, total) == 0 ? 0 : errno;
    } while (err == EINTR);
    if (err != 0 && err != EOPNOTSUPP)
      ST_FAULT("cannot write ", path, ": ", errno_text(err), " (reserving its ", total, " bytes)");
  }

  // The digest is computed beside the writes, from the same bytes in memory.
  BackgroundDigest digest(runs, piece_bytes);
  const IoBuffers buffers(kWritesInFlight,
                          static_cast<size_t>(std::min<int64_t>(
                              static_cast<int64_t>(kIoBytes),
                              (total + static_cast<int64_t>(kDirectAlign) - 1) / kDirectAlign * kDirectAlign)));
  WriteFailure failure;
  bool buffered = true;
  UniqueFd direct(::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC));
  if (direct.get() >= 0) {  // else the file system refuses O_DIRECT (tmpfs before Linux 6.6: EINVAL)
    // The aligned part goes direct; the last partial block, if any, through the page cache.
    const int64_t aligned_end = total / static_cast<int64_t>(kDirectAlign) * static_cast<int64_t>(kDirectAlign);
    failure = write_pieces(direct.get(), runs, 0, aligned_end, buffers);
    // EINVAL: the file system opened O_DIRECT but refuses its writes; the buffered pass below starts over.
    buffered = failure.err == EINVAL;
    if (!failure.failed()) failure = write_pieces(fd.get(), runs, aligned_end, total, buffers);
    if (direct.close() != 0 && !failure.failed()) failure = {errno, total};
  }
  if (buffered) failure = write_pieces(fd.get(), runs, 0, total, buffers);
  if (failure.failed())
    ST_FAULT("cannot write ", path, ": ", errno_text(failure.err), " (at byte ", failure.offset, " of ", total, ")");
  // Durable before the caller commits it: data, length and the device's cache.
  while (::fsync(fd.get()) != 0) {
    if (errno != EINTR) ST_FAULT("fsync of ", path, " failed: ", errno_text());
  }
  if (fd.close() != 0) ST_FAULT("close of ", path, " after writing failed: ", errno_text());
  return {total, digest.result()};
}

}  // namespace st
