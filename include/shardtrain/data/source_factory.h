// One entry point from a data path and format to a TokenSource.
//
//   path == "@fortunes"          -> the built-in corpus (fortunes.h); needs format == kText
//   format == DataFormat::kLlmc  -> llm.c shards, a file or a glob (llmc_source.h), with their loss masks under
//                                   loss_mask (data.loss_mask)
//   format == DataFormat::kText  -> raw bytes, a file or a glob (text_source.h); text has no loss mask
//
// Everything is validated here, at open, so bad data stops a run before its first step (kBadInput naming
// the file and byte offset).
//
//   std::unique_ptr<st::TokenSource> src = st::open_token_source(cfg.data.path, cfg.data.format, 50257);
#pragma once

#include <memory>
#include <string>

#include "shardtrain/core/config.h"
#include "shardtrain/data/token_source.h"

namespace st {

// `vocab_size` is model.vocab_size: llm.c tokens must be below it; text needs it >= 256. `key` is the config key
// that gave `path` (data.path, data.val_path), for the errors that name it.
std::unique_ptr<TokenSource> open_token_source(const std::string& path, DataFormat format, int vocab_size,
                                               const std::string& key = "data.path",
                                               LossMaskMode loss_mask = LossMaskMode::kAuto);

}  // namespace st
