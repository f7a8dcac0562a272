#include "shardtrain/data/slice_source.h"

#include <utility>

#include "shardtrain/core/error.h"

namespace st {

SliceSource::SliceSource(std::shared_ptr<const TokenSource> parent, int64_t begin, int64_t end)
    : parent_(std::move(parent)), begin_(begin), end_(end) {
  ST_CHECK(parent_ != nullptr);
  ST_CHECK(0 <= begin_ && begin_ <= end_ && end_ <= parent_->size(), "slice [", begin_, ", ", end_, ") of ",
           parent_->size(), " tokens");
}

void SliceSource::read(int64_t offset, int64_t count, int32_t* out) const {
  ST_CHECK(offset >= 0 && count >= 0 && offset <= size() - count, "read [", offset, ", +", count,
           ") outside a slice of ", size(), " tokens");
  parent_->read(begin_ + offset, count, out);
}

void SliceSource::read_mask(int64_t offset, int64_t count, uint8_t* out) const {
  ST_CHECK(offset >= 0 && count >= 0 && offset <= size() - count, "mask read [", offset, ", +", count,
           ") outside a slice of ", size(), " tokens");
  parent_->read_mask(begin_ + offset, count, out);
}

std::string SliceSource::describe() const {
  return str_cat("tokens [", begin_, ", ", end_, ") of ", parent_->describe());
}

}  // namespace st
