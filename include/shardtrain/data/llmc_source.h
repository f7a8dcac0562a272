// llm.c token shards (the `.bin` files written by llm.c's dev/data scripts, or by shardtrain's LlmcShardWriter),
// read as one token stream, with their loss masks where they have them. The formats are in llmc_format.h and
// docs/data-format.md: uint16 shards (magic 20240520, version 1) and uint32 shards (magic 20240801, version 7), told
// apart by the header of each file, so one glob may mix them; any other magic and version is refused.
//
// Loss masks (data.loss_mask): with LossMaskMode::kAuto, the masks are used when the files have them (NAME.mask
// beside NAME.bin): either every file of the pattern has one or none does; a pattern where some do and some do not
// is refused naming the first file without one. With kOff no mask is read. A stream whose masks mark no target at
// all is refused: there would be nothing to train on. A mask of version 2 records its shard's content hash
// (LlmcContentHash, computed in the same pass as the token check): a mask whose hash is not its shard's is refused
// naming both; version 1 records none and is read with a warning.
//
// A shard of a set that `shardtrain tokenize` has not finished (its PREFIX.incomplete marker exists,
// incomplete_marker_for()) is refused, naming the marker.
//
// Every file is validated completely when it is opened: header, size, every token (< vocab_size) and every mask byte
// (0 or 1). The scans run on all OpenMP threads with pread(2) into per-thread buffers rather than through the
// mapping: page-faulting a multi-GB mapping in 4 KiB pages runs at a fraction of memory bandwidth, a buffered read
// does not (docs/performance.md, "CPU figures"). Any problem throws kBadInput whose message names the file path, the
// field or byte offset, and the expected and actual values, so a bad shard stops the run before its first step.
//
//   auto src = st::open_llmc_source("data/tinyshakespeare_train_*.bin", /*vocab_size=*/50257);
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "shardtrain/core/config.h"
#include "shardtrain/data/file_token_source.h"
#include "shardtrain/data/llmc_format.h"

namespace st {

// Opens `path` (one file or a glob, expanded by expand_data_path(): sorted) as one stream: the tokens of
// the first file, then of the second, ... `vocab_size` is the model's (model.vocab_size), > 0. `key` names the config
// key that gave `path` in the errors about the pattern and its masks.
std::unique_ptr<FileTokenSource> open_llmc_source(const std::string& path, int vocab_size,
                                                  const std::string& key = "data.path",
                                                  LossMaskMode loss_mask = LossMaskMode::kAuto);

// Index of the first token >= limit in p[0, n), or -1 if there is none. Scans in parallel (OpenMP);
// the answer does not depend on the number of threads.
int64_t find_first_token_at_least(const uint16_t* p, int64_t n, int64_t limit);
int64_t find_first_token_at_least(const uint32_t* p, int64_t n, int64_t limit);

// The same over the n tokens of `width` (kU16 or kU32) stored from byte `byte_offset` of the file at `path`, read
// with pread(2) in parallel chunks. An I/O error throws kFault naming the path.
int64_t find_first_token_at_least_in_file(const std::string& path, int64_t byte_offset, int64_t n, int64_t limit,
                                          TokenWidth width = TokenWidth::kU16);

// The n mask bytes stored from byte `byte_offset` of the file at `path`, scanned like the tokens: the index of the
// first byte that is neither 0 nor 1 (-1 if none) and, when there is none, how many are 1.
struct MaskScan {
  int64_t first_bad = -1;
  int64_t targets = 0;
};
MaskScan scan_mask_file(const std::string& path, int64_t byte_offset, int64_t n);

}  // namespace st
