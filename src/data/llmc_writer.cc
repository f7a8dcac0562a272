#include "shardtrain/data/llmc_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <utility>

#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/new_file.h"
#include "shardtrain/core/unique_fd.h"

namespace st {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "llm.c shards are little-endian; so must the host be");

// Bytes gathered before one write(2): large enough to amortise the call, small enough to stay in cache.
constexpr size_t kBufferBytes = size_t{1} << 20;
// Tokens converted to the shard's width at a time, so one write() of billions of tokens needs no copy of them all.
constexpr int64_t kStagingTokens = int64_t{1} << 18;

std::string directory_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// Errors of open(2) that say the place cannot be written by anyone's retry: the user's output path is wrong.
bool is_path_error(int err) {
  return err == EACCES || err == EPERM || err == EROFS || err == ENOENT || err == ENOTDIR || err == EISDIR ||
         err == ENAMETOOLONG || err == ELOOP;
}

// Writes all n bytes, at `offset` (pwrite) or, with offset < 0, at the file's position (write); false with errno set
// on failure (a short write is continued).
bool write_all(int fd, const uint8_t* p, size_t n, off_t offset = -1) {
  while (n > 0) {
    const ssize_t r = offset < 0 ? ::write(fd, p, n) : ::pwrite(fd, p, n, offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r == 0) errno = EIO;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
    if (offset >= 0) offset += r;
  }
  return true;
}

bool fsync_fd(int fd) {
  while (::fsync(fd) != 0) {
    if (errno != EINTR) return false;
  }
  return true;
}

}  // namespace

LlmcShardWriter::LlmcShardWriter(std::string path, int token_bits, bool with_mask)
    : path_(std::move(path)), token_bits_(token_bits) {
  if (token_bits_ != 16 && token_bits_ != 32)
    ST_BAD_INPUT("llm.c shard ", path_, ": token width ", token_bits_, " bits: expected 16 or 32");
  if (with_mask) mask_path_ = mask_path_for(path_);
  // Only new files: an existing shard is refused, and so is a mask at this shard's mask path, which a shard written
  // without one would otherwise be read with.
  if (path_exists(path_))
    ST_BAD_INPUT("llm.c shard ", path_, ": exists; shardtrain writes only new files: remove it, or write elsewhere");
  if (path_exists(mask_path_for(path_)))
    ST_BAD_INPUT("llm.c shard ", path_, ": ", mask_path_for(path_), " exists, and would be read as ",
                 with_mask ? "this shard's new" : "the loss mask of this shard, which has none",
                 "; shardtrain writes only new files: remove it, or write elsewhere");
  open_out(tokens_, path_);
  if (with_mask) open_out(mask_, mask_path_);
  open_ = true;
  // The headers' room; close() writes them once the count is known.
  const std::vector<uint8_t> zeros(static_cast<size_t>(kLlmcHeaderBytes), 0);
  append(tokens_, zeros.data(), zeros.size());
  if (with_mask) append(mask_, zeros.data(), zeros.size());
}

LlmcShardWriter::~LlmcShardWriter() {
  if (open_) discard();
}

void LlmcShardWriter::open_out(Out& out, const std::string& final_path) {
  out.final_path = final_path;
  std::string name = final_path + ".tmp.XXXXXX";
  const int fd = ::mkstemp(name.data());
  if (fd < 0) {
    const int err = errno;
    discard();
    if (is_path_error(err))
      ST_BAD_INPUT("llm.c shard ", path_, ": cannot create a file in ", directory_of(final_path), ": ",
                   errno_text(err));
    ST_FAULT("llm.c shard ", path_, ": cannot create a temporary file beside ", final_path, ": ", errno_text(err));
  }
  out.fd = UniqueFd(fd);
  out.tmp_path = name;
  if (::fchmod(fd, 0644) != 0) fail(str_cat("chmod of ", name), errno);
  out.buffer.reserve(kBufferBytes);
}

void LlmcShardWriter::append(Out& out, const void* bytes, size_t n) {
  const auto* p = static_cast<const uint8_t*>(bytes);
  while (n > 0) {
    const size_t take = std::min(n, kBufferBytes - out.buffer.size());
    out.buffer.insert(out.buffer.end(), p, p + take);
    p += take;
    n -= take;
    if (out.buffer.size() == kBufferBytes) flush(out);
  }
}

void LlmcShardWriter::flush(Out& out) {
  if (out.buffer.empty()) return;
  if (!write_all(out.fd.get(), out.buffer.data(), out.buffer.size())) fail(str_cat("write to ", out.tmp_path), errno);
  out.buffer.clear();
}

void LlmcShardWriter::check_open(const char* call) const {
  ST_CHECK(open_, "LlmcShardWriter::", call, " on ", path_, " after close() or a failure");
}

void LlmcShardWriter::write(const int32_t* tokens, int64_t n) { write(tokens, nullptr, n); }

void LlmcShardWriter::write(const int32_t* tokens, const uint8_t* mask, int64_t n) {
  check_open("write");
  ST_CHECK(n >= 0, "write of ", n, " tokens");
  ST_CHECK(mask == nullptr || !mask_path_.empty(), "LlmcShardWriter::write with mask bytes on ", path_,
           ", which was opened without a mask");
  ST_CHECK(mask != nullptr || mask_path_.empty(), "LlmcShardWriter::write without mask bytes on ", path_,
           ", which was opened with a mask");
  const int64_t limit = int64_t{1} << token_bits_;
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= limit) {
      discard();
      ST_BAD_INPUT("llm.c shard ", path_, ": token ", tokens[i], " at index ", count_ + i, " does not fit a ",
                   token_bits_, "-bit shard: expected 0 <= token < ", limit,
                   token_bits_ == 16 ? " (a vocabulary above 65536 needs 32-bit shards)" : "");
    }
    if (mask != nullptr && mask[i] > 1) {
      discard();
      ST_BAD_INPUT("llm.c shard ", path_, ": mask byte ", static_cast<int>(mask[i]), " at index ", count_ + i,
                   ": expected 0 (not a target) or 1 (a target)");
    }
  }
  if (n > kLlmcMaxTokens - count_) {
    discard();
    ST_BAD_INPUT("llm.c shard ", path_, ": ", count_ + n, " tokens exceed the ", kLlmcMaxTokens,
                 " one shard can hold (its header counts them in an int32): start another shard");
  }
  const size_t width = static_cast<size_t>(token_bits_ / 8);
  for (int64_t lo = 0; lo < n; lo += kStagingTokens) {
    const int64_t m = std::min(kStagingTokens, n - lo);
    staging_.resize(static_cast<size_t>(m) * width);
    for (int64_t i = 0; i < m; ++i) {
      if (width == 2) {
        const uint16_t t = static_cast<uint16_t>(tokens[lo + i]);
        std::memcpy(staging_.data() + 2 * i, &t, 2);
      } else {
        const uint32_t t = static_cast<uint32_t>(tokens[lo + i]);
        std::memcpy(staging_.data() + 4 * i, &t, 4);
      }
    }
    append(tokens_, staging_.data(), staging_.size());
    if (mask != nullptr) {
      content_hash_.update(staging_.data(), staging_.size());
      append(mask_, mask + lo, static_cast<size_t>(m));
    }
  }
  count_ += n;
}

void LlmcShardWriter::finish(Out& out, int32_t magic, int32_t version, uint64_t shard_hash) {
  flush(out);
  int32_t header[kLlmcHeaderInts] = {magic, version, static_cast<int32_t>(count_)};
  if (magic == kLlmcMaskMagic) {
    header[kLlmcMaskShardHashLo] = static_cast<int32_t>(static_cast<uint32_t>(shard_hash));
    header[kLlmcMaskShardHashHi] = static_cast<int32_t>(static_cast<uint32_t>(shard_hash >> 32));
  }
  if (!write_all(out.fd.get(), reinterpret_cast<const uint8_t*>(header), sizeof(header), 0))
    fail(str_cat("write of the header of ", out.tmp_path), errno);
  if (!fsync_fd(out.fd.get())) fail(str_cat("fsync of ", out.tmp_path), errno);
  // NFS and some local file systems report deferred write errors only at close.
  if (out.fd.close() != 0) fail(str_cat("close of ", out.tmp_path), errno);
}

void LlmcShardWriter::close() {
  check_open("close");
  if (count_ == 0) {
    discard();
    ST_BAD_INPUT("llm.c shard ", path_, ": closed with no token written; a shard holds at least one");
  }
  const bool masked = !mask_path_.empty();
  finish(tokens_, token_bits_ == 16 ? kLlmcMagic : kLlmcMagic32, token_bits_ == 16 ? kLlmcVersion : kLlmcVersion32);
  if (masked) {
    finish(mask_, kLlmcMaskMagic, kLlmcMaskVersion, content_hash_.value());
    // The mask first: a reader that finds the shard finds its mask.
    commit(mask_, mask_path_);
    mask_renamed_ = true;
  } else if (path_exists(mask_path_for(path_))) {
    // A mask put at this shard's mask path since the constructor's check would be read as this one's.
    discard();
    ST_BAD_INPUT("llm.c shard ", path_, ": ", mask_path_for(path_),
                 " appeared while the shard was written, and would be read as its loss mask; nothing was left under ",
                 path_);
  }
  commit(tokens_, path_);
  shard_renamed_ = true;
  // The renames are durable once the directory entry is.
  const std::string dir = directory_of(path_);
  UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dfd) fail(str_cat("open of its directory ", dir, " to fsync it"), errno);
  const bool synced = fsync_fd(dfd.get());
  const int err = errno;
  dfd.reset();
  if (!synced) fail(str_cat("fsync of its directory ", dir), err);
  open_ = false;
  mask_renamed_ = shard_renamed_ = false;
}

void LlmcShardWriter::commit(Out& out, const std::string& final_path) {
  if (const int err = rename_no_replace(out.tmp_path, final_path)) {
    if (err != EEXIST) fail(str_cat("rename of ", out.tmp_path, " to ", final_path), err);
    discard();
    ST_BAD_INPUT("llm.c shard ", path_, ": ", final_path,
                 " appeared while the shard was written; nothing was replaced, and nothing was left under ", path_,
                 mask_path_.empty() ? "" : " or " + mask_path_, " by this writer");
  }
  out.tmp_path.clear();
}

void LlmcShardWriter::discard() noexcept {
  open_ = false;
  for (Out* out : {&tokens_, &mask_}) {
    out->fd.reset();
    if (!out->tmp_path.empty()) ::unlink(out->tmp_path.c_str());
    out->tmp_path.clear();
    out->buffer.clear();
  }
  if (shard_renamed_) ::unlink(path_.c_str());
  if (mask_renamed_) ::unlink(mask_path_.c_str());
  mask_renamed_ = shard_renamed_ = false;
}

void LlmcShardWriter::fail(const std::string& what, int err) {
  discard();
  ST_FAULT("llm.c shard ", path_, ": ", what, " failed: ", errno_text(err), "; nothing was left under ", path_,
           mask_path_.empty() ? std::string() : " or " + mask_path_);
}

}  // namespace st
