#include "shardtrain/ckpt/file_transfer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "shardtrain/ckpt/digest.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/unique_fd.h"

namespace st {
namespace {

// The header on the wire: native-endian (every rank runs the same build), fixed size.
struct Header {
  int64_t file = -1;  // -1: nothing follows
  int64_t bytes = 0;
  int64_t piece_bytes = 0;  // the digest's scheme (digest.h)
  char digest[64] = {};
};

// The sending side: reads the file piece by piece; after a read error it sends zeros so that the receiver still
// gets every byte the header announced (and a hash that tells it the file is bad).
class Source {
 public:
  explicit Source(const FileOffer& o) : offer_(o) {
    fd_ = UniqueFd(::open(o.path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd_) error_ = str_cat("cannot read ", o.path, ": ", errno_text());
  }
  void read(char* buf, int64_t n) {
    int64_t done = 0;
    while (error_.empty() && done < n) {
      const ssize_t got = ::read(fd_.get(), buf + done, static_cast<size_t>(n - done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) error_ = str_cat("read of ", offer_.path, " failed: ", errno_text());
      if (got == 0) error_ = str_cat(offer_.path, " ended before its ", offer_.bytes, " bytes");
      if (got > 0) done += got;
    }
    if (done < n) std::memset(buf + done, 0, static_cast<size_t>(n - done));
  }
  const std::string& error() const { return error_; }

 private:
  const FileOffer& offer_;
  UniqueFd fd_;
  std::string error_;
};

// The receiving side: writes and hashes what arrives; after a write error it only hashes.
class Sink {
 public:
  // A header's piece size below 0 is reported after the exchange, like any other failure: throwing here would leave
  // the sender waiting for its bytes to be taken.
  Sink(std::string path, int64_t piece_bytes) : path_(std::move(path)), hash_(std::max<int64_t>(piece_bytes, 0)) {
    fd_ = UniqueFd(::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd_) error_ = str_cat("cannot create ", path_, ": ", errno_text());
    if (piece_bytes < 0) error_ = str_cat("the header gives digest piece size ", piece_bytes, ", expected >= 0");
  }
  void write(const char* buf, int64_t n) {
    hash_.update(buf, static_cast<size_t>(n));
    int64_t done = 0;
    while (error_.empty() && done < n) {
      const ssize_t put = ::write(fd_.get(), buf + done, static_cast<size_t>(n - done));
      if (put < 0 && errno == EINTR) continue;
      if (put < 0) error_ = str_cat("write of ", path_, " failed: ", errno_text());
      if (put > 0) done += put;
    }
  }
  // fsync and close; then the digest of everything received.
  std::string finish() {
    if (error_.empty() && ::fsync(fd_.get()) != 0) error_ = str_cat("fsync of ", path_, " failed: ", errno_text());
    if (fd_.close() != 0 && error_.empty()) error_ = str_cat("close of ", path_, " failed: ", errno_text());
    return hash_.hex();
  }
  const std::string& error() const { return error_; }

 private:
  std::string path_;
  UniqueFd fd_;
  std::string error_;
  DigestStream hash_;
};

}  // namespace

void transfer_files(Communicator& comm, int dest, const FileOffer* offer, int source, FileTake* take,
                    const std::function<std::string(int file)>& path_for) {
  Header out, in;
  if (offer != nullptr && offer->file >= 0) {
    ST_CHECK(offer->digest.size() == 64, "transfer_files: the digest of ", offer->path, " is not 64 hex digits");
    ST_CHECK(offer->piece_bytes >= 0, "transfer_files: digest piece size ", offer->piece_bytes);
    out.file = offer->file;
    out.bytes = offer->bytes;
    out.piece_bytes = offer->piece_bytes;
    std::memcpy(out.digest, offer->digest.data(), 64);
  }
  comm.send_recv(&out, offer ? static_cast<int64_t>(sizeof(out)) : 0, dest, &in,
                 take ? static_cast<int64_t>(sizeof(in)) : 0, source);

  const int64_t send_bytes = offer && out.file >= 0 ? out.bytes : 0;
  const int64_t recv_bytes = take && in.file >= 0 ? in.bytes : 0;
  std::unique_ptr<Source> src = send_bytes > 0 ? std::make_unique<Source>(*offer) : nullptr;
  std::unique_ptr<Sink> sink;
  if (take && in.file >= 0) {
    take->received = true;
    take->file = static_cast<int>(in.file);
    take->bytes = in.bytes;
    take->digest.assign(in.digest, 64);
    take->path = path_for(take->file);
    sink = std::make_unique<Sink>(take->path, in.piece_bytes);
  }
  std::vector<char> out_buf(static_cast<size_t>(std::min(send_bytes, kTransferChunk)));
  std::vector<char> in_buf(static_cast<size_t>(std::min(recv_bytes, kTransferChunk)));
  // Round i moves piece i of each direction; both peers count the pieces alike from the header's size.
  for (int64_t off = 0; off < send_bytes || off < recv_bytes; off += kTransferChunk) {
    const int64_t s = std::clamp<int64_t>(send_bytes - off, 0, kTransferChunk);
    const int64_t r = std::clamp<int64_t>(recv_bytes - off, 0, kTransferChunk);
    if (s > 0) src->read(out_buf.data(), s);
    comm.send_recv(out_buf.data(), s, s > 0 ? dest : -1, in_buf.data(), r, r > 0 ? source : -1);
    if (r > 0) sink->write(in_buf.data(), r);
  }

  std::string error;
  if (src && !src->error().empty()) error = str_cat("sending ", offer->path, " to rank ", dest, ": ", src->error());
  if (sink) {
    const std::string hash = sink->finish();
    const std::string what = str_cat("receiving file ", take->file, " from rank ", source, " into ", take->path);
    if (!sink->error().empty()) {
      error += str_cat(error.empty() ? "" : "; ", what, ": ", sink->error());
    } else if (hash != take->digest) {
      error += str_cat(error.empty() ? "" : "; ", what, ": SHA-256 mismatch: expected ", take->digest,
                       " (the sender's), actual ", hash);
    }
  }
  if (!error.empty()) ST_FAULT(error);
}

}  // namespace st
