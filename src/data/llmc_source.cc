#include "shardtrain/data/llmc_source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/log.h"
#include "shardtrain/core/new_file.h"
#include "shardtrain/core/unique_fd.h"
#include "shardtrain/data/path_glob.h"

namespace st {
namespace {

int32_t header_int(const MappedFile& f, int64_t index) {
  int32_t v;
  std::memcpy(&v, f.data() + 4 * index, sizeof(v));
  return v;
}

const char* width_name(TokenWidth w) { return w == TokenWidth::kU32 ? "uint32" : "uint16"; }

// A token shard's header: its token count and width.
struct ShardHeader {
  int64_t n = 0;
  TokenWidth width = TokenWidth::kU16;
};

// Checks that the file `what` names (e.g. "llm.c data file X") is at least a header long; returns header[2], its
// element count.
int64_t check_header_count(const MappedFile& f, const std::string& what) {
  if (f.size() == 0) ST_BAD_INPUT(what, " is empty (0 bytes)");
  if (f.size() < kLlmcHeaderBytes) {
    ST_BAD_INPUT(what, " is ", f.size(), " bytes, shorter than the ", kLlmcHeaderBytes,
                 "-byte header (it ends at byte ", f.size(), ")");
  }
  return header_int(f, 2);
}

// Checks that a file whose header says n elements of `elem` bytes is exactly that long.
void check_payload_size(const MappedFile& f, const std::string& what, int64_t n, int64_t elem, const char* unit) {
  const int64_t payload = f.size() - kLlmcHeaderBytes;
  const int64_t expected_size = kLlmcHeaderBytes + elem * n;
  if (f.size() < expected_size) {
    ST_BAD_INPUT(what, " is truncated: the header at byte 8 says ", n, " ", unit, ", i.e. bytes [", kLlmcHeaderBytes,
                 ", ", expected_size, "), but the file is ", f.size(), " bytes: room for ", payload / elem, " ", unit);
  }
  if (f.size() > expected_size) {
    ST_BAD_INPUT(what, " has ", f.size() - expected_size, " trailing bytes: the header at byte 8 says ", n, " ", unit,
                 ", so the file should end at byte ", expected_size, ", but it is ", f.size(), " bytes");
  }
}

// Checks one shard's header and size. Every message names the file and the byte offset it is about.
ShardHeader check_llmc_header(const MappedFile& f) {
  const std::string what = str_cat("llm.c data file ", f.path());
  check_header_count(f, what);
  ShardHeader h;
  const int32_t magic = header_int(f, 0);
  const int32_t version = header_int(f, 1);
  int32_t expected_version = kLlmcVersion;
  if (magic == kLlmcMagic) {
    h.width = TokenWidth::kU16;
  } else if (magic == kLlmcMagic32) {
    h.width = TokenWidth::kU32;
    expected_version = kLlmcVersion32;
  } else {
    ST_BAD_INPUT(what, ": bad magic at byte 0: expected ", kLlmcMagic, " (uint16 tokens) or ", kLlmcMagic32,
                 " (uint32 tokens), got ", magic, " (is this an llm.c .bin shard? for raw text set data.format=text)");
  }
  if (version != expected_version) {
    ST_BAD_INPUT(what, ": unsupported version at byte 4: expected ", expected_version, " (the version of magic ", magic,
                 ", ", width_name(h.width), " tokens), got ", version);
  }
  h.n = header_int(f, 2);
  if (h.n < 0) ST_BAD_INPUT(what, ": negative token count ", h.n, " in the header at byte 8");
  if (h.n == 0) ST_BAD_INPUT(what, " is empty: the header at byte 8 says 0 tokens");
  check_payload_size(f, what, h.n, static_cast<int64_t>(h.width), "tokens");
  return h;
}

std::string hex64(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// What check_mask found besides the targets: whether the mask records its shard (version 2) or not (version 1).
struct MaskCheck {
  int64_t targets = 0;
  bool unbound = false;  // version 1: tied to the shard by length only
};

// Checks a loss mask's header and size against its token shard's count n and content hash, and every byte.
MaskCheck check_mask(const MappedFile& m, int64_t n, uint64_t shard_hash, const std::string& shard_path) {
  const std::string what = str_cat("loss mask ", m.path());
  const int64_t count = check_header_count(m, what);
  const int32_t magic = header_int(m, 0);
  if (magic != kLlmcMaskMagic)
    ST_BAD_INPUT(what, ": bad magic at byte 0: expected ", kLlmcMaskMagic, " (an llm.c loss mask), got ", magic);
  const int32_t version = header_int(m, 1);
  if (version != kLlmcMaskVersion && version != kLlmcMaskVersionUnbound)
    ST_BAD_INPUT(what, ": unsupported version at byte 4: expected ", kLlmcMaskVersion, " (or ", kLlmcMaskVersionUnbound,
                 ", which records no shard), got ", version);
  if (count != n) {
    ST_BAD_INPUT(what, ": the header at byte 8 says ", count, " tokens, but its token shard ", shard_path, " holds ", n,
                 ": expected ", n, ", got ", count);
  }
  check_payload_size(m, what, n, 1, "bytes");
  if (version == kLlmcMaskVersion) {
    const uint64_t recorded = static_cast<uint64_t>(static_cast<uint32_t>(header_int(m, kLlmcMaskShardHashLo))) |
                              static_cast<uint64_t>(static_cast<uint32_t>(header_int(m, kLlmcMaskShardHashHi))) << 32;
    if (recorded != shard_hash)
      ST_BAD_INPUT(what, " belongs to another shard: its header (bytes 12-19) records the token shard content hash ",
                   hex64(recorded), ", but its token shard ", shard_path, " hashes to ", hex64(shard_hash),
                   " (same length, other tokens): put each mask beside its own shard, or run tokenize again");
  }
  const MaskScan scan = scan_mask_file(m.path(), kLlmcHeaderBytes, n);
  if (scan.first_bad >= 0) {
    const uint8_t value = m.data()[kLlmcHeaderBytes + scan.first_bad];
    ST_BAD_INPUT(what, ": byte value ", static_cast<int>(value), " at byte ", kLlmcHeaderBytes + scan.first_bad,
                 " (token index ", scan.first_bad, "): expected 0 (not a target) or 1 (a target)");
  }
  return MaskCheck{scan.targets, version == kLlmcMaskVersionUnbound};
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The loss masks of `paths` under `mode`: none (empty), or one path per file.
std::vector<std::string> mask_paths(const std::vector<std::string>& paths, LossMaskMode mode, const std::string& key,
                                    const std::string& pattern) {
  if (mode == LossMaskMode::kOff) return {};
  std::vector<std::string> masks;
  std::vector<bool> has;
  for (const std::string& p : paths) {
    masks.push_back(mask_path_for(p));
    has.push_back(exists(masks.back()));
  }
  const auto with = std::find(has.begin(), has.end(), true);
  if (with == has.end()) return {};
  const auto without = std::find(has.begin(), has.end(), false);
  if (without != has.end()) {
    const size_t w = static_cast<size_t>(with - has.begin()), wo = static_cast<size_t>(without - has.begin());
    ST_BAD_INPUT(key, " '", pattern, "': loss mask ", masks[wo], " of ", paths[wo], " is missing, but ", paths[w],
                 " has one (", masks[w],
                 "): with data.loss_mask=auto either every file has its mask or none does "
                 "(data.loss_mask=off reads no mask)");
  }
  return masks;
}

// Reads exactly `bytes` bytes at `offset` (pread may return short counts).
bool pread_all(int fd, void* buf, int64_t bytes, int64_t offset) {
  auto* p = static_cast<char*>(buf);
  while (bytes > 0) {
    const ssize_t r = ::pread(fd, p, static_cast<size_t>(bytes), offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    bytes -= r;
    offset += r;
  }
  return true;
}

// Index of the first element >= lim in p[0, n), or -1; the per-chunk body of every scan.
template <typename U>
int64_t first_in_chunk(const U* p, int64_t n, U lim) {
  U mx = 0;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, p[i]);  // vectorises: the common, clean case
  if (mx < lim) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] >= lim) return i;
  }
  return -1;
}

// The sum of p[0, n) (mask bytes: the targets of a clean chunk).
int64_t sum_of_chunk(const uint8_t* p, int64_t n) {
  uint64_t s = 0;
  for (int64_t i = 0; i < n; ++i) s += p[i];  // vectorises
  return static_cast<int64_t>(s);
}

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

template <typename U>
int64_t find_first_at_least(const U* p, int64_t n, int64_t limit) {
  if (limit > static_cast<int64_t>(std::numeric_limits<U>::max())) return -1;
  if (limit <= 0) return n > 0 ? 0 : -1;
  const U lim = static_cast<U>(limit);
  // Chunks of 128 KiB: big enough that the per-chunk max loop vectorises and runs at bandwidth, small enough that a
  // few thousand of them balance over the threads of a multi-GB shard.
  constexpr int64_t kChunk = (int64_t{1} << 17) / static_cast<int64_t>(sizeof(U));
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  int64_t first = kNone;
#pragma omp parallel for schedule(static) reduction(min : first)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t lo = c * kChunk;
    const int64_t i = first_in_chunk(p + lo, std::min(n, lo + kChunk) - lo, lim);
    if (i >= 0) first = std::min(first, lo + i);
  }
  return first == kNone ? -1 : first;
}

// What one pass over a file's elements found.
struct FileScan {
  int64_t first_bad = -1;  // the index of the first element >= the limit, or -1
  int64_t sum = 0;         // with kSum: the sum of the elements (meaningful when there is no bad one)
  uint64_t hash_sum = 0;   // with kHash: the sum of LlmcContentHash's terms of the elements' bytes
};

// Over the n elements of U stored from byte `byte_offset` of `path`: the index of the first >= lim (none is looked
// for when `check` is false), with kSum the sum of all of them, with kHash their bytes' content-hash terms.
template <typename U, bool kSum, bool kHash>
FileScan scan_file(const std::string& path, int64_t byte_offset, int64_t n, U lim, bool check = true) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) ST_BAD_INPUT("data file ", path, ": cannot open: ", errno_text());
  // 1 MiB per chunk: large enough to amortise the syscall, small enough to stay in L2 while it is scanned and to
  // balance a multi-GB file over the threads. (A multiple of 8 bytes: the content hash's words start each chunk.)
  constexpr int64_t kChunk = (int64_t{1} << 20) / static_cast<int64_t>(sizeof(U));
  const int64_t nchunks = (n + kChunk - 1) / kChunk;
  int64_t first = kNone, sum = 0;
  uint64_t hash_sum = 0;
  bool io_error = false;
#pragma omp parallel reduction(min : first) reduction(+ : sum, hash_sum) reduction(|| : io_error)
  {
    std::vector<U> buf(static_cast<size_t>(std::min(n, kChunk)));
#pragma omp for schedule(static)
    for (int64_t c = 0; c < nchunks; ++c) {
      const int64_t lo = c * kChunk;
      const int64_t count = std::min(n, lo + kChunk) - lo;
      const int64_t bytes = static_cast<int64_t>(sizeof(U)) * count;
      if (!pread_all(fd.get(), buf.data(), bytes, byte_offset + static_cast<int64_t>(sizeof(U)) * lo)) {
        io_error = true;
        continue;
      }
      if (check) {
        const int64_t i = first_in_chunk(buf.data(), count, lim);
        if (i >= 0) first = std::min(first, lo + i);
      }
      if constexpr (kSum) sum += sum_of_chunk(buf.data(), count);
      if constexpr (kHash)
        hash_sum +=
            LlmcContentHash::hash_words(reinterpret_cast<const uint8_t*>(buf.data()), static_cast<size_t>(bytes),
                                        static_cast<uint64_t>(static_cast<int64_t>(sizeof(U)) * lo / 8));
    }
  }
  if (io_error) ST_FAULT("data file ", path, ": read error while validating its ", n, " elements");
  return FileScan{first == kNone ? -1 : first, sum, hash_sum};
}

template <typename U>
int64_t find_first_in_file(const std::string& path, int64_t byte_offset, int64_t n, int64_t limit) {
  if (limit > static_cast<int64_t>(std::numeric_limits<U>::max()) || n <= 0) return -1;
  if (limit <= 0) return 0;
  return scan_file<U, false, false>(path, byte_offset, n, static_cast<U>(limit)).first_bad;
}

// A token shard's scan: the first token >= limit (-1 if none) and, with `hash`, its content hash (the one its loss
// mask records), in the same pass.
struct TokenScan {
  int64_t first_bad = -1;
  uint64_t content_hash = 0;
};

template <typename U>
TokenScan scan_tokens(const std::string& path, int64_t n, int64_t limit, bool hash) {
  if (!hash) return {find_first_in_file<U>(path, kLlmcHeaderBytes, n, limit), 0};
  const bool check = limit <= static_cast<int64_t>(std::numeric_limits<U>::max());
  if (check && limit <= 0) return {0, 0};
  const FileScan f = scan_file<U, false, true>(path, kLlmcHeaderBytes, n, check ? static_cast<U>(limit) : U{0}, check);
  return {f.first_bad, LlmcContentHash::finish(f.hash_sum, static_cast<uint64_t>(n) * sizeof(U))};
}

// The stored token at index i of a validated shard.
int64_t token_at(const MappedFile& f, TokenWidth width, int64_t i) {
  const uint8_t* p = f.data() + kLlmcHeaderBytes + static_cast<int64_t>(width) * i;
  if (width == TokenWidth::kU32) {
    uint32_t t;
    std::memcpy(&t, p, sizeof(t));
    return t;
  }
  uint16_t t;
  std::memcpy(&t, p, sizeof(t));
  return t;
}

}  // namespace

int64_t find_first_token_at_least(const uint16_t* p, int64_t n, int64_t limit) {
  return find_first_at_least(p, n, limit);
}

int64_t find_first_token_at_least(const uint32_t* p, int64_t n, int64_t limit) {
  return find_first_at_least(p, n, limit);
}

int64_t find_first_token_at_least_in_file(const std::string& path, int64_t byte_offset, int64_t n, int64_t limit,
                                          TokenWidth width) {
  ST_CHECK(width == TokenWidth::kU16 || width == TokenWidth::kU32, "token width ", static_cast<int>(width));
  if (width == TokenWidth::kU32) return find_first_in_file<uint32_t>(path, byte_offset, n, limit);
  return find_first_in_file<uint16_t>(path, byte_offset, n, limit);
}

MaskScan scan_mask_file(const std::string& path, int64_t byte_offset, int64_t n) {
  if (n <= 0) return {};
  const FileScan f = scan_file<uint8_t, true, false>(path, byte_offset, n, uint8_t{2});
  return MaskScan{f.first_bad, f.sum};
}

std::unique_ptr<FileTokenSource> open_llmc_source(const std::string& path, int vocab_size, const std::string& key,
                                                  LossMaskMode loss_mask) {
  if (vocab_size <= 0) ST_BAD_INPUT("model.vocab_size must be > 0, got ", vocab_size);
  const std::vector<std::string> paths = expand_data_path(path, key);
  const std::vector<std::string> masks = mask_paths(paths, loss_mask, key, path);
  std::vector<FilePayload> files;
  std::vector<MaskPayload> mask_payloads;
  files.reserve(paths.size());
  int64_t total = 0, targets = 0, wide = 0;
  std::vector<size_t> unbound;  // the files whose masks are version 1
  for (size_t i = 0; i < paths.size(); ++i) {
    const std::string& p = paths[i];
    // A shard of a set that tokenize has not finished (or that it left when killed) is not data yet.
    const std::string marker = incomplete_marker_for(p);
    if (!marker.empty() && path_exists(marker))
      ST_BAD_INPUT("llm.c data file ", p, ": its set is incomplete: ", marker,
                   " exists (shardtrain tokenize is still writing it, or was interrupted before it finished); run "
                   "tokenize again, after removing what the interrupted run left");
    MappedFile f(p);
    const ShardHeader h = check_llmc_header(f);
    const TokenScan scan = h.width == TokenWidth::kU32 ? scan_tokens<uint32_t>(p, h.n, vocab_size, !masks.empty())
                                                       : scan_tokens<uint16_t>(p, h.n, vocab_size, !masks.empty());
    const int64_t bad = scan.first_bad;
    if (bad >= 0) {
      ST_BAD_INPUT("llm.c data file ", p, ": token ", token_at(f, h.width, bad), " at byte ",
                   kLlmcHeaderBytes + static_cast<int64_t>(h.width) * bad, " (token index ", bad,
                   ") is >= model.vocab_size ", vocab_size);
    }
    if (!masks.empty()) {
      MappedFile m(masks[i]);
      const MaskCheck c = check_mask(m, h.n, scan.content_hash, p);
      targets += c.targets;
      if (c.unbound) unbound.push_back(i);
      mask_payloads.push_back(MaskPayload{std::move(m), kLlmcHeaderBytes});
    }
    files.push_back(FilePayload{std::move(f), kLlmcHeaderBytes, h.n, h.width});
    total += h.n;
    wide += h.width == TokenWidth::kU32 ? 1 : 0;
  }
  if (!unbound.empty()) {
    const size_t i = unbound.front();
    ST_LOG_WARN("loss mask ", masks[i], " is format version 1, which records no token shard: it is tied to ", paths[i],
                " by its length only",
                unbound.size() > 1
                    ? str_cat(" (and so are ", unbound.size() - 1, " more masks of ", key, " '", path, "')")
                    : std::string(),
                "; shardtrain tokenize writes version 2 masks, which record their shard's content hash");
  }
  if (!masks.empty() && targets == 0) {
    ST_BAD_INPUT(key, " '", path, "': the loss masks of its ", paths.size(), " file(s) mark none of its ", total,
                 " tokens as a target (every mask byte is 0): there is nothing to train on");
  }
  const int64_t narrow = static_cast<int64_t>(paths.size()) - wide;
  const std::string widths = wide == 0     ? "uint16"
                             : narrow == 0 ? "uint32"
                                           : str_cat(narrow, " uint16 and ", wide, " uint32");
  std::string description =
      str_cat("llm.c shards '", path, "' (", paths.size(), paths.size() == 1 ? " file, " : " files, ", total,
              " tokens, ", widths, masks.empty() ? std::string() : str_cat("; loss masks: ", targets, " targets"), ")");
  ST_LOG_INFO("data: ", description);
  return std::make_unique<FileTokenSource>(std::move(files), vocab_size, std::move(description),
                                           std::move(mask_payloads));
}

}  // namespace st
