// llm.c token shards (the `.bin` files written by llm.c's dev/data scripts), read as one token stream.
//
// File format (all little-endian):
//   bytes [0, 1024)        header: 256 x int32
//                            header[0] = 20240520 (magic), at byte 0
//                            header[1] = 1 (version: uint16 tokens), at byte 4
//                            header[2] = N, the number of tokens, at byte 8
//   bytes [1024, 1024+2N)  N x uint16 tokens; token i is at byte 1024 + 2*i
// The file must be exactly 1024 + 2N bytes long, and N >= 1.
//
// Every file is validated completely when it is opened: header, size and every token (< vocab_size).
// The token scan runs on all OpenMP threads with pread(2) into per-thread buffers rather than through the
// mapping: page-faulting a multi-GB mapping in 4 KiB pages runs at a fraction of memory bandwidth
// (measured 2 GB/s vs 9 GB/s on a warm page cache), a buffered read does not. Any problem throws kBadInput whose
// message names the file path and the byte offset, so a bad shard stops the run before its first step.
//
//   auto src = st::open_llmc_source("data/tinyshakespeare_train_*.bin", /*vocab_size=*/50257);
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "shardtrain/data/file_token_source.h"

namespace st {

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int64_t kLlmcHeaderInts = 256;
inline constexpr int64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;

// Opens `path` (one file or a glob, expanded by expand_data_path(): sorted) as one stream: the tokens of
// the first file, then of the second, ... `vocab_size` is the model's (model.vocab_size), > 0. `key` names the
// config key that gave `path` in the errors about the pattern.
std::unique_ptr<FileTokenSource> open_llmc_source(const std::string& path, int vocab_size,
                                                  const std::string& key = "data.path");

// Index of the first token >= limit in p[0, n), or -1 if there is none. Scans in parallel (OpenMP);
// the answer does not depend on the number of threads.
int64_t find_first_token_at_least(const uint16_t* p, int64_t n, int64_t limit);

// The same over the n uint16 tokens stored from byte `byte_offset` of the file at `path`, read with
// pread(2) in parallel chunks. An I/O error throws kFault naming the path.
int64_t find_first_token_at_least_in_file(const std::string& path, int64_t byte_offset, int64_t n, int64_t limit);

}  // namespace st
