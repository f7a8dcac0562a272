// The digest that checkpoint manifests record for their files: SHA-256 over pieces, of bytes in memory, of a file, or
// of bytes as they arrive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace st {

// SHA-256 (OpenSSL libcrypto) of a whole file, lowercase hex: file_digest(path, 0).
std::string sha256_file(const std::string& path);
std::string sha256_hex(const void* data, size_t bytes);

// A checkpoint file's digest (docs/checkpoint-format.md, "Digests"), lowercase hex. With piece_bytes > 0 it is the
// SHA-256 of the SHA-256 digests (32 bytes each, in file order) of the file's consecutive piece_bytes pieces, the
// last one shorter (a file of no bytes has no pieces: the SHA-256 of nothing). Threads hash the pieces side by side,
// so the digest keeps up with a disk that writes or reads faster than one core computes SHA-256. With
// piece_bytes == 0 it is the SHA-256 of the whole file, as format version 1 manifests record it.
inline constexpr int64_t kDigestPieceBytes = int64_t{16} << 20;  // what writers use
inline constexpr int64_t kMinDigestPieceBytes = 4096;            // the range a manifest may give
inline constexpr int64_t kMaxDigestPieceBytes = int64_t{1} << 30;

// The digest of bytes in memory.
std::string digest_hex(const void* data, size_t bytes, int64_t piece_bytes);
// The digest of a file: digest_and_read with nothing wanted.
std::string file_digest(const std::string& path, int64_t piece_bytes);

// The digest of bytes that come in order in pieces of any size (a file received over the network, hashed as it
// arrives), on the calling thread.
class DigestStream {
 public:
  explicit DigestStream(int64_t piece_bytes);
  ~DigestStream();
  DigestStream(const DigestStream&) = delete;
  DigestStream& operator=(const DigestStream&) = delete;
  void update(const void* data, size_t bytes);
  std::string hex();  // ends the stream (call once)

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

}  // namespace st
