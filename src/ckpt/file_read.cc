// One ordered pass over a whole file that hashes it and copies the wanted ranges out on the way, and parallel reads of
// a range of a file in the page cache.
#include "shardtrain/ckpt/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <condition_variable>
#include <deque>

#include "bulk_io.h"
#include "digest_internal.h"
#include "shardtrain/ckpt/digest.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/unique_fd.h"

namespace st {

using file_io_internal::Digest;
using file_io_internal::EvpCtx;
using file_io_internal::for_each_index;
using file_io_internal::hex_of;
using file_io_internal::IoBuffers;
using file_io_internal::kDigestThreads;
using file_io_internal::kIoBytes;
using file_io_internal::kPassReadBytes;
using file_io_internal::kPassReads;
using file_io_internal::pread_exact;
using file_io_internal::preadv_exact;
using file_io_internal::root_of;
using file_io_internal::Runs;
using file_io_internal::sha256_begin;
using file_io_internal::sha256_final;
using file_io_internal::sha256_update;

namespace {

// Threads that copy a range of a file in the page cache into memory (read_at).
constexpr int kCopyThreads = 4;

// One pass over file bytes [begin, end) for digest_and_read and FilePassInParts: begin is a multiple of piece_bytes
// and end one too or the file's end, so that the pass hashes whole pieces. The calling thread reads the bytes in
// order, kPassReadBytes per read, into one of kPassReads slots; kDigestThreads threads hash and copy each read's bytes
// while the next ones are read, and hand the slot back when done.
//
// Hashing: pieces are dealt to the threads in stripes of about kIoBytes (whole pieces, consecutive), stripe s to
// thread s % kDigestThreads. A thread gets the bytes of its stripes in file order, so it hashes one piece at a time,
// and a piece longer than a read (or the whole file, when piece_bytes is 0) is hashed across reads by one thread.
// Copying: each buffer's share of the `wanted` ranges is copied by one thread, the buffers dealt round robin.
class FilePass {
 public:
  FilePass(const std::string& path, int fd, int64_t begin, int64_t end, int64_t piece_bytes,
           const std::vector<WantedBytes>& wanted)
      : path_(path),
        fd_(fd),
        begin_(begin),
        size_(end),
        piece_bytes_(piece_bytes > 0 ? piece_bytes : end),
        stripe_(piece_bytes > 0 ? piece_bytes * std::max<int64_t>(1, static_cast<int64_t>(kIoBytes) / piece_bytes)
                                : end),
        wanted_(wanted),
        buf_bytes_(static_cast<size_t>(std::min<int64_t>(end - begin, static_cast<int64_t>(kIoBytes)))),
        bufs_per_read_(static_cast<int>((std::min<int64_t>(end - begin, static_cast<int64_t>(kPassReadBytes)) +
                                         static_cast<int64_t>(buf_bytes_) - 1) /
                                        static_cast<int64_t>(buf_bytes_))),
        read_bytes_(static_cast<int64_t>(buf_bytes_) * bufs_per_read_),
        reads_((end - begin + read_bytes_ - 1) / read_bytes_),
        slots_(static_cast<int>(std::min<int64_t>(reads_, kPassReads))),
        buffers_(slots_ * bufs_per_read_, buf_bytes_),
        digests_(static_cast<size_t>((end - begin + piece_bytes_ - 1) / piece_bytes_)),
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

  // Reads the bytes and returns their pieces' digests in order (one, the whole file's, when piece_bytes is 0).
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
      const int64_t begin = begin_ + r * read_bytes_, end = std::min(size_, begin + read_bytes_);
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
        digests_[static_cast<size_t>(piece - begin_ / piece_bytes_)] = sha256_final(ctx.get());
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
  const int64_t begin_, size_, piece_bytes_, stripe_;  // size_: the pass's end
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
  const std::vector<Digest> digests = FilePass(path, fd.get(), 0, size, piece_bytes, wanted).run();
  return piece_bytes > 0 ? root_of(digests) : hex_of(digests[0]);
}

FilePassInParts::FilePassInParts(const std::string& path, int64_t piece_bytes)
    : path_(path), piece_bytes_(piece_bytes) {
  ST_CHECK(piece_bytes > 0, path, ": digest piece size ", piece_bytes);
  fd_ = UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd_.get() < 0) ST_BAD_INPUT("cannot read ", path, " to hash it: ", errno_text());
  (void)::posix_fadvise(fd_.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
  struct stat st {};
  if (::fstat(fd_.get(), &st) != 0) ST_FAULT("cannot stat ", path, ": ", errno_text());
  size_ = static_cast<int64_t>(st.st_size);
}

FilePassInParts::~FilePassInParts() = default;

void FilePassInParts::read(const std::vector<WantedBytes>& wanted) {
  int64_t need = read_;
  for (const WantedBytes& w : wanted) {
    if (w.offset < 0 || w.bytes < 0 || w.offset > size_ - w.bytes)
      ST_BAD_INPUT(path_, ": bytes [", w.offset, ", ", w.offset + w.bytes, ") are wanted from a file of ", size_,
                   " bytes");
    if (w.bytes > 0) need = std::max(need, w.offset + w.bytes);
  }
  // The pass goes on to the end of the piece that holds the last wanted byte; what it read past that byte is kept
  // for the next call.
  const int64_t end = need <= read_ ? read_ : std::min(size_, (need + piece_bytes_ - 1) / piece_bytes_ * piece_bytes_);
  std::vector<WantedBytes> from_pass;
  std::string next_carry;
  for (const WantedBytes& w : wanted) {
    if (w.bytes == 0) continue;
    char* out = static_cast<char*>(w.out);
    const int64_t w_end = w.offset + w.bytes;
    // Bytes read by an earlier call: kept ones from the carry, older ones (wanted out of file order) read again.
    const int64_t kept_to = std::min(w_end, read_);
    if (w.offset < carry_at_) {
      const int64_t to = std::min(kept_to, carry_at_);
      read_at(fd_.get(), path_, w.offset, to - w.offset, out);
    }
    const int64_t kept_from = std::max(w.offset, carry_at_);
    if (kept_from < kept_to)
      std::memcpy(out + (kept_from - w.offset), carry_.data() + (kept_from - carry_at_),
                  static_cast<size_t>(kept_to - kept_from));
    if (w_end > read_) {
      const int64_t from = std::max(w.offset, read_);
      from_pass.push_back(WantedBytes{from, w_end - from, out + (from - w.offset)});
    }
  }
  if (end > read_) {
    next_carry.assign(static_cast<size_t>(end - need), '\0');
    if (end > need) from_pass.push_back(WantedBytes{need, end - need, next_carry.data()});
    const std::vector<Digest> d = FilePass(path_, fd_.get(), read_, end, piece_bytes_, from_pass).run();
    digests_.insert(digests_.end(), d.begin(), d.end());
    read_ = end;
    carry_at_ = need;
    carry_.swap(next_carry);
  }
}

std::string FilePassInParts::finish() {
  if (read_ < size_) {
    const std::vector<Digest> d = FilePass(path_, fd_.get(), read_, size_, piece_bytes_, {}).run();
    digests_.insert(digests_.end(), d.begin(), d.end());
    read_ = size_;
  }
  return root_of(digests_);
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

}  // namespace st
