#include "shardtrain/ckpt/file_io.h"

#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

#include "shardtrain/core/error.h"

namespace st {
namespace {

// A file descriptor that closes itself. close() is called explicitly where its error matters (after
// writing: NFS and some local file systems report deferred write errors only there).
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Returns close(2)'s result; errno is set on failure.
  int close() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd);
  }

 private:
  int fd_ = -1;
};

std::string errno_text() { return std::strerror(errno); }

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

std::string sha256_end(EVP_MD_CTX* ctx) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  ST_CHECK(EVP_DigestFinal_ex(ctx, digest, &len) == 1, "EVP_DigestFinal_ex: ", openssl_error());
  static const char kHex[] = "0123456789abcdef";
  std::string out(2 * len, '0');
  for (unsigned int i = 0; i < len; ++i) {
    out[2 * i] = kHex[digest[i] >> 4];
    out[2 * i + 1] = kHex[digest[i] & 0xf];
  }
  return out;
}

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
    ST_BAD_INPUT(what, " ", path, ": output directory ", dir, " cannot be used: ", std::strerror(err));
  }
  if (!S_ISDIR(st.st_mode))
    ST_BAD_INPUT(what, " ", path, ": ", dir,
                 S_ISREG(st.st_mode) ? " is a file, not a directory" : " is not a directory");
}

void fsync_path(const std::string& path) {
  // O_RDONLY works for directories too; fsync on a read-only descriptor flushes the whole inode.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
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
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
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
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
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

std::string sha256_file(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) ST_BAD_INPUT("cannot read ", path, " to hash it: ", errno_text());
  EvpCtx ctx = sha256_begin();
  std::vector<char> buf(size_t{1} << 20);
  int64_t done = 0;
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    // The file opened, so a failing read is the storage's fault, not the user's.
    if (n < 0) ST_FAULT("read of ", path, " failed after ", done, " bytes: ", errno_text());
    if (n == 0) break;
    sha256_update(ctx.get(), buf.data(), static_cast<size_t>(n));
    done += n;
  }
  return sha256_end(ctx.get());
}

std::string sha256_hex(const void* data, size_t bytes) {
  EvpCtx ctx = sha256_begin();
  sha256_update(ctx.get(), data, bytes);
  return sha256_end(ctx.get());
}

struct Sha256Stream::Ctx {
  EvpCtx evp = sha256_begin();
};

Sha256Stream::Sha256Stream() : ctx_(std::make_unique<Ctx>()) {}
Sha256Stream::~Sha256Stream() = default;
void Sha256Stream::update(const void* data, size_t bytes) { sha256_update(ctx_->evp.get(), data, bytes); }
std::string Sha256Stream::hex() { return sha256_end(ctx_->evp.get()); }

}  // namespace st
