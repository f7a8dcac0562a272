// Private to src/ckpt: what the bulk reads (file_read.cc), the writer (file_write.cc) and the digests (digest.cc) of
// checkpoint files share: the I/O sizes, page-aligned buffers kept between calls, a file's bytes as runs of memory,
// a fan-out over threads, and positioned reads that take exactly the bytes asked for.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace st::file_io_internal {

// Bytes per read and write of a large file, and per pooled buffer: 16 MiB pieces, four writes in flight
// (file_write.cc), wrote as fast as any size and count tried (docs/performance.md, "Checkpoint writes and loads").
constexpr size_t kIoBytes = size_t{16} << 20;
// Threads that hash a file's digest pieces from memory: four compute SHA-256 at four times one core's speed, faster
// than the disks the pieces are written to.
constexpr int kDigestThreads = 4;
// A pass over a whole file (digest_and_read) reads it in order, one 64 MiB read at a time, as `dd bs=64M` does:
// on the disks measured this reads a cold file as fast as anything tried, and faster than several reads in flight
// at different offsets, which break up the kernel's read-ahead (docs/performance.md, "Checkpoint writes and loads").
constexpr size_t kPassReadBytes = size_t{64} << 20;
// Reads of a pass held in memory at once: one being read while the threads hash and copy the others.
constexpr int kPassReads = 3;

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

// Page-aligned anonymous memory (so O_DIRECT can use it), mapped with its pages present (MAP_POPULATE): one
// system call instead of a page fault per 4 KiB on first touch. std::bad_alloc when it cannot be mapped.
class IoBuffer {
 public:
  explicit IoBuffer(size_t bytes);
  IoBuffer(IoBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
  IoBuffer& operator=(IoBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  IoBuffer(const IoBuffer&) = delete;
  IoBuffer& operator=(const IoBuffer&) = delete;
  ~IoBuffer();
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
  // `count` buffers of kIoBytes each (taken from the pool where it has them) when bytes >= kIoBytes, else `count`
  // buffers of `bytes`.
  IoBuffers(int count, size_t bytes);
  IoBuffers(const IoBuffers&) = delete;
  IoBuffers& operator=(const IoBuffers&) = delete;
  ~IoBuffers();  // pooled buffers go back to the pool
  char* operator[](size_t i) const { return buffers_[i].data(); }
  size_t count() const { return buffers_.size(); }

 private:
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

// preadv(2) of exactly n bytes at `offset` into consecutive buffers of buf_bytes each, resuming after short reads. A
// failing read is kFault naming the path and the byte; so is an earlier end of the file (it shrank while read).
void preadv_exact(int fd, const std::string& path, char* const* bufs, size_t buf_bytes, size_t n, int64_t offset);
// preadv_exact into one buffer.
void pread_exact(int fd, const std::string& path, char* buf, size_t n, int64_t offset);

}  // namespace st::file_io_internal
