#include "shardtrain/data/data_split.h"

#include <cmath>
#include <iomanip>
#include <memory>
#include <utility>

#include "shardtrain/core/error.h"
#include "shardtrain/data/slice_source.h"
#include "shardtrain/data/source_factory.h"

namespace st {
namespace {

void require_one_window(const TokenSource& src, const std::string& key, const std::string& path, int seq_len) {
  if (src.size() < static_cast<int64_t>(seq_len) + 1) {
    ST_BAD_INPUT(key, " '", path, "' holds ", src.size(),
                 " tokens, fewer than model.seq_len + 1 = ", static_cast<int64_t>(seq_len) + 1,
                 " (one training window)");
  }
}

}  // namespace

DataSplit open_data(const DataConfig& cfg, int vocab_size, int seq_len) {
  if (seq_len <= 0) ST_BAD_INPUT("model.seq_len must be > 0, got ", seq_len);
  const int64_t need = static_cast<int64_t>(seq_len) + 1;
  DataSplit split;
  if (!cfg.val_path.empty()) {
    split.train = open_token_source(cfg.path, cfg.format, vocab_size, "data.path", cfg.loss_mask);
    require_one_window(*split.train, "data.path", cfg.path, seq_len);
    split.val = open_token_source(cfg.val_path, cfg.format, vocab_size, "data.val_path", cfg.loss_mask);
    require_one_window(*split.val, "data.val_path", cfg.val_path, seq_len);
    return split;
  }

  if (!(cfg.val_holdout > 0.0 && cfg.val_holdout < 1.0)) {
    ST_BAD_INPUT("data.val_holdout must be in (0, 1) when data.val_path is empty, got ", cfg.val_holdout);
  }
  std::shared_ptr<const TokenSource> all =
      open_token_source(cfg.path, cfg.format, vocab_size, "data.path", cfg.loss_mask);
  const int64_t n = all->size();
  // floor() in double is exact enough: a stream of 2^53 tokens is far beyond any disk.
  const int64_t n_val = static_cast<int64_t>(std::floor(static_cast<double>(n) * cfg.val_holdout));
  const int64_t n_train = n - n_val;
  if (n_train < need || n_val < need) {
    ST_BAD_INPUT("data.path '", cfg.path, "' holds ", n,
                 " tokens; holding out data.val_holdout = ", std::setprecision(10), cfg.val_holdout,
                 " of them gives train = ", n_train, " and val = ", n_val,
                 " tokens, but each needs at least model.seq_len + 1 = ", need,
                 ". Use more data, change data.val_holdout, or set data.val_path");
  }
  split.train = std::make_unique<SliceSource>(all, 0, n_train);
  split.val = std::make_unique<SliceSource>(all, n_train, n);
  return split;
}

}  // namespace st
