// The training and validation streams of a run, from the [data] config.
//
//   data.val_path empty: one stream S is opened from data.path and split at a token boundary:
//       val   = the last floor(S.size() * data.val_holdout) tokens,
//       train = the tokens before them.
//     0 < data.val_holdout < 1 is required.
//   data.val_path set: train is all of data.path, val is all of data.val_path, same data.format.
//   Loss masks (data.loss_mask=auto): a held-out val is a slice of the training stream, masks included; a
//   data.val_path decides for itself whether its files have masks (llmc_source.h).
//
// Each stream must hold at least seq_len + 1 tokens (one window of the sampler); otherwise kBadInput
// naming the paths and all the numbers.
//
//   st::DataSplit d = st::open_data(cfg.data, cfg.model.vocab_size, cfg.model.seq_len);
//   st::Sampler train(*d.train, opts);
#pragma once

#include <memory>

#include "shardtrain/core/config.h"
#include "shardtrain/data/token_source.h"

namespace st {

struct DataSplit {
  std::unique_ptr<TokenSource> train;
  std::unique_ptr<TokenSource> val;
};

DataSplit open_data(const DataConfig& cfg, int vocab_size, int seq_len);

}  // namespace st
