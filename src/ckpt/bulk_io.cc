#include "bulk_io.h"

#include <sys/mman.h>
#include <sys/uio.h>

#include <cerrno>
#include <climits>
#include <new>

#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"

namespace st::file_io_internal {
namespace {

// kIoBytes buffers kept mapped between calls: a pass's reads.
constexpr int kPooledBuffers = kPassReads * static_cast<int>(kPassReadBytes / kIoBytes);

std::mutex& pool_mu() {
  static std::mutex mu;
  return mu;
}

std::vector<IoBuffer>& pool() {
  static std::vector<IoBuffer> buffers;
  return buffers;
}

}  // namespace

IoBuffer::IoBuffer(size_t bytes) : bytes_(std::max<size_t>(bytes, 1)) {
  void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  data_ = static_cast<char*>(p);
}

IoBuffer::~IoBuffer() {
  if (data_ != nullptr) ::munmap(data_, bytes_);
}

IoBuffers::IoBuffers(int count, size_t bytes) : pooled_(bytes >= kIoBytes) {
  if (pooled_) {
    std::lock_guard<std::mutex> lock(pool_mu());
    std::vector<IoBuffer>& kept = pool();
    while (!kept.empty() && static_cast<int>(buffers_.size()) < count) {
      buffers_.push_back(std::move(kept.back()));
      kept.pop_back();
    }
  }
  while (static_cast<int>(buffers_.size()) < count) buffers_.emplace_back(pooled_ ? kIoBytes : bytes);
}

IoBuffers::~IoBuffers() {
  if (!pooled_) return;
  std::lock_guard<std::mutex> lock(pool_mu());
  for (IoBuffer& b : buffers_)
    if (static_cast<int>(pool().size()) < kPooledBuffers) pool().push_back(std::move(b));
}

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

void pread_exact(int fd, const std::string& path, char* buf, size_t n, int64_t offset) {
  preadv_exact(fd, path, &buf, n, n, offset);
}

}  // namespace st::file_io_internal
