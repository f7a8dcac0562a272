// The checkpoint files' digest: SHA-256 over pieces, of bytes in memory, of a stream, of a file.
#include "shardtrain/ckpt/digest.h"

#include <openssl/err.h>

#include <algorithm>

#include "digest_internal.h"
#include "shardtrain/ckpt/file_read.h"
#include "shardtrain/core/error.h"

namespace st {
namespace file_io_internal {
namespace {

std::string openssl_error() {
  const unsigned long code = ERR_get_error();
  if (code == 0) return "no OpenSSL error queued";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof(buf));
  return buf;
}

}  // namespace

EvpCtx sha256_begin() {
  EvpCtx ctx(EVP_MD_CTX_new());
  ST_CHECK(ctx != nullptr, "EVP_MD_CTX_new: ", openssl_error());
  ST_CHECK(EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1, "EVP_DigestInit_ex: ", openssl_error());
  return ctx;
}

void sha256_update(EVP_MD_CTX* ctx, const void* data, size_t bytes) {
  ST_CHECK(EVP_DigestUpdate(ctx, data, bytes) == 1, "EVP_DigestUpdate: ", openssl_error());
}

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

std::string root_of(const std::vector<Digest>& pieces) {
  EvpCtx ctx = sha256_begin();
  for (const Digest& d : pieces) sha256_update(ctx.get(), d.data(), d.size());
  return sha256_end(ctx.get());
}

std::string digest_runs(const Runs& runs, int64_t piece_bytes, const std::atomic<bool>& cancel) {
  if (piece_bytes == 0) {
    EvpCtx ctx = sha256_begin();
    runs.for_each_span(0, runs.total(), [&](const char* p, size_t n) { sha256_update(ctx.get(), p, n); });
    return sha256_end(ctx.get());
  }
  const std::vector<Digest> pieces = digest_pieces(runs, piece_bytes, cancel);
  return cancel ? std::string() : root_of(pieces);
}

std::vector<Digest> digest_pieces(const Runs& runs, int64_t piece_bytes, const std::atomic<bool>& cancel) {
  std::vector<Digest> digests(static_cast<size_t>((runs.total() + piece_bytes - 1) / piece_bytes));
  for_each_index(static_cast<int64_t>(digests.size()), kDigestThreads, [&](int, int64_t i) {
    if (cancel) return false;
    EvpCtx ctx = sha256_begin();
    runs.for_each_span(i * piece_bytes, std::min(runs.total(), (i + 1) * piece_bytes),
                       [&](const char* p, size_t n) { sha256_update(ctx.get(), p, n); });
    digests[static_cast<size_t>(i)] = sha256_final(ctx.get());
    return true;
  });
  if (cancel) digests.clear();
  return digests;
}

}  // namespace file_io_internal

using file_io_internal::Digest;
using file_io_internal::digest_runs;
using file_io_internal::EvpCtx;
using file_io_internal::Runs;
using file_io_internal::sha256_begin;
using file_io_internal::sha256_end;
using file_io_internal::sha256_final;
using file_io_internal::sha256_update;

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

}  // namespace st
