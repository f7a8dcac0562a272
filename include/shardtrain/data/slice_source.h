// SliceSource: tokens [begin, end) of another TokenSource, read through to it (no copy). Used to hold out
// the tail of the training stream for validation (open_data() in data_split.h).
//
// Ownership: the slice shares ownership of its parent, so a train and a val slice of one stream keep it
// (and its mappings) alive for as long as either is used.
//
//   std::shared_ptr<const st::TokenSource> all = st::open_token_source(path, fmt, vocab);
//   st::SliceSource val(all, 950, all->size());   // val.read(0, ...) reads all's token 950
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "shardtrain/data/token_source.h"

namespace st {

class SliceSource final : public TokenSource {
 public:
  // Needs 0 <= begin <= end <= parent->size() (an internal error otherwise).
  SliceSource(std::shared_ptr<const TokenSource> parent, int64_t begin, int64_t end);

  int64_t size() const override { return end_ - begin_; }
  void read(int64_t offset, int64_t count, int32_t* out) const override;
  std::string describe() const override;
  int vocab_size() const override { return parent_->vocab_size(); }
  bool has_loss_mask() const override { return parent_->has_loss_mask(); }
  void read_mask(int64_t offset, int64_t count, uint8_t* out) const override;

  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

 private:
  std::shared_ptr<const TokenSource> parent_;
  int64_t begin_;
  int64_t end_;
};

}  // namespace st
