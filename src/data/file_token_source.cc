#include "shardtrain/data/file_token_source.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "shardtrain/core/error.h"

namespace st {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "llm.c shards are little-endian; so must the host be");

// n tokens of type U from src to out. The payload may sit at any byte offset in principle, so each is copied
// through memcpy rather than read through a cast pointer.
template <typename U>
void widen(const uint8_t* src, int64_t n, int32_t* out) {
  for (int64_t k = 0; k < n; ++k) {
    U t;
    std::memcpy(&t, src + sizeof(U) * k, sizeof(t));
    out[k] = static_cast<int32_t>(t);
  }
}

}  // namespace

FileTokenSource::FileTokenSource(std::vector<FilePayload> files, int vocab_size, std::string description,
                                 std::vector<MaskPayload> masks)
    : files_(std::move(files)),
      masks_(std::move(masks)),
      vocab_size_(vocab_size),
      description_(std::move(description)) {
  ST_CHECK(vocab_size_ > 0, "vocab_size = ", vocab_size_);
  ST_CHECK(masks_.empty() || masks_.size() == files_.size(), masks_.size(), " masks for ", files_.size(), " files");
  starts_.reserve(files_.size() + 1);
  starts_.push_back(0);
  for (size_t i = 0; i < files_.size(); ++i) {
    const FilePayload& f = files_[i];
    const int64_t w = static_cast<int64_t>(f.width);
    ST_CHECK(f.byte_offset >= 0 && f.count >= 0 && f.byte_offset + f.count * w <= f.file.size(), f.file.path(),
             ": payload [", f.byte_offset, ", +", f.count, " x ", w, " bytes) exceeds the file's ", f.file.size(),
             " bytes");
    if (!masks_.empty()) {
      const MaskPayload& m = masks_[i];
      ST_CHECK(m.byte_offset >= 0 && m.byte_offset + f.count <= m.file.size(), m.file.path(), ": mask [", m.byte_offset,
               ", +", f.count, " bytes) exceeds the file's ", m.file.size(), " bytes");
    }
    starts_.push_back(starts_.back() + f.count);
  }
}

template <typename Piece>
void FileTokenSource::for_each_piece(int64_t offset, int64_t count, Piece&& piece) const {
  ST_CHECK(offset >= 0 && count >= 0 && offset <= size() - count, "read [", offset, ", +", count,
           ") outside a stream of ", size(), " tokens (", description_, ")");
  // The file holding `offset` is the last one whose start is <= offset (files with no tokens are skipped
  // because the next file has the same start).
  size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) - starts_.begin()) - 1;
  while (count > 0) {
    const int64_t local = offset - starts_[i];
    const int64_t n = std::min(count, files_[i].count - local);
    piece(i, local, n);
    offset += n;
    count -= n;
    ++i;
  }
}

void FileTokenSource::read(int64_t offset, int64_t count, int32_t* out) const {
  for_each_piece(offset, count, [&](size_t i, int64_t first, int64_t n) {
    const FilePayload& f = files_[i];
    const uint8_t* src = f.file.data() + f.byte_offset + first * static_cast<int64_t>(f.width);
    switch (f.width) {
      case TokenWidth::kU8:
        for (int64_t k = 0; k < n; ++k) out[k] = src[k];
        break;
      case TokenWidth::kU16:
        widen<uint16_t>(src, n, out);
        break;
      case TokenWidth::kU32:
        widen<uint32_t>(src, n, out);  // < vocab_size <= INT32_MAX, checked at open
        break;
    }
    out += n;
  });
}

void FileTokenSource::read_mask(int64_t offset, int64_t count, uint8_t* out) const {
  if (masks_.empty()) {
    TokenSource::read_mask(offset, count, out);
    return;
  }
  for_each_piece(offset, count, [&](size_t i, int64_t first, int64_t n) {
    const MaskPayload& m = masks_[i];
    std::memcpy(out, m.file.data() + m.byte_offset + first, static_cast<size_t>(n));
    out += n;
  });
}

}  // namespace st
