// Private to src/ckpt: the digest's parts (docs/checkpoint-format.md, "Digests") for the readers and the writer of
// checkpoint files: SHA-256 through OpenSSL, the root over the pieces' digests, and the digest of bytes in memory
// (Runs) on kDigestThreads threads, also in the background beside a write. Implemented in digest.cc.
#pragma once

#include <openssl/evp.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bulk_io.h"

namespace st::file_io_internal {

struct EvpCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using EvpCtx = std::unique_ptr<EVP_MD_CTX, EvpCtxFree>;
using Digest = std::array<unsigned char, 32>;

// A SHA-256 from start to end: begin, update any number of times, then final (the 32 bytes) or end (lowercase hex).
// A failing OpenSSL call is kInternal with OpenSSL's error text.
EvpCtx sha256_begin();
void sha256_update(EVP_MD_CTX* ctx, const void* data, size_t bytes);
Digest sha256_final(EVP_MD_CTX* ctx);
std::string sha256_end(EVP_MD_CTX* ctx);
std::string hex_of(const Digest& digest);

// The digest of a file cut into pieces: the SHA-256 of the pieces' SHA-256s in order.
std::string root_of(const std::vector<Digest>& pieces);

// The digests of the pieces of `runs` (piece_bytes > 0), in order, hashed on kDigestThreads threads. Returns an empty
// vector once *cancel is set.
std::vector<Digest> digest_pieces(const Runs& runs, int64_t piece_bytes, const std::atomic<bool>& cancel);
// The digest (file_digest's) of `runs`: root_of(digest_pieces), or with piece_bytes 0 the SHA-256 of all of it.
// Returns "" once *cancel is set.
std::string digest_runs(const Runs& runs, int64_t piece_bytes, const std::atomic<bool>& cancel);

// The digests of the pieces of `runs` (piece_bytes > 0), computed on threads of its own. Destroyed before result(), it
// stops early.
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
  // Waits for the pieces' digests; rethrows what it threw.
  std::vector<Digest> result() {
    thread_.join();
    if (error_) std::rethrow_exception(error_);
    return std::move(pieces_);
  }

 private:
  void run(const Runs& runs, int64_t piece_bytes) {
    try {
      pieces_ = digest_pieces(runs, piece_bytes, cancel_);
    } catch (...) {
      error_ = std::current_exception();
    }
  }

  std::atomic<bool> cancel_{false};
  std::vector<Digest> pieces_;
  std::exception_ptr error_;
  std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace st::file_io_internal
