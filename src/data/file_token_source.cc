#include "shardtrain/data/file_token_source.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "shardtrain/core/error.h"

namespace st {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "llm.c shards are little-endian; so must the host be");

FileTokenSource::FileTokenSource(std::vector<FilePayload> files, TokenWidth width, int vocab_size,
                                 std::string description)
    : files_(std::move(files)), width_(width), vocab_size_(vocab_size), description_(std::move(description)) {
  ST_CHECK(vocab_size_ > 0, "vocab_size = ", vocab_size_);
  const int64_t w = static_cast<int64_t>(width_);
  starts_.reserve(files_.size() + 1);
  starts_.push_back(0);
  for (const FilePayload& f : files_) {
    ST_CHECK(f.byte_offset >= 0 && f.count >= 0 && f.byte_offset + f.count * w <= f.file.size(), f.file.path(),
             ": payload [", f.byte_offset, ", +", f.count, " x ", w, " bytes) exceeds the file's ", f.file.size(),
             " bytes");
    starts_.push_back(starts_.back() + f.count);
  }
}

void FileTokenSource::read(int64_t offset, int64_t count, int32_t* out) const {
  ST_CHECK(offset >= 0 && count >= 0 && offset <= size() - count, "read [", offset, ", +", count,
           ") outside a stream of ", size(), " tokens (", description_, ")");
  // The file holding `offset` is the last one whose start is <= offset (files with no tokens are skipped
  // because the next file has the same start).
  size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - 1;
  while (count > 0) {
    const FilePayload& f = files_[i];
    const int64_t local = offset - starts_[i];
    const int64_t n = std::min(count, f.count - local);
    const uint8_t* src = f.file.data() + f.byte_offset;
    if (width_ == TokenWidth::kU8) {
      for (int64_t k = 0; k < n; ++k) out[k] = src[local + k];
    } else {
      // The payload may sit at any byte offset in principle, so copy through memcpy rather than cast.
      for (int64_t k = 0; k < n; ++k) {
        uint16_t t;
        std::memcpy(&t, src + 2 * (local + k), sizeof(t));
        out[k] = t;
      }
    }
    out += n;
    offset += n;
    count -= n;
    ++i;
  }
}

}  // namespace st
