#include "shardtrain/data/llmc_format.h"

#include <algorithm>
#include <cstring>

#include "shardtrain/core/error.h"

namespace st {

std::string mask_path_for(const std::string& shard_path) {
  constexpr char kBin[] = ".bin";
  constexpr size_t kBinLen = sizeof(kBin) - 1;
  if (shard_path.size() > kBinLen && shard_path.compare(shard_path.size() - kBinLen, kBinLen, kBin) == 0)
    return shard_path.substr(0, shard_path.size() - kBinLen) + ".mask";
  return shard_path + ".mask";
}

std::string incomplete_marker_for_prefix(const std::string& prefix) { return prefix + ".incomplete"; }

std::string incomplete_marker_for(const std::string& shard_path) {
  // PREFIX _ (train|val) _ digits .bin, read from the end.
  const size_t slash = shard_path.rfind('/');
  const size_t name = slash == std::string::npos ? 0 : slash + 1;
  constexpr char kBin[] = ".bin";
  const size_t bin_len = sizeof(kBin) - 1;
  if (shard_path.size() < name + bin_len || shard_path.compare(shard_path.size() - bin_len, bin_len, kBin) != 0)
    return "";
  size_t end = shard_path.size() - bin_len, digits = end;
  while (digits > name && shard_path[digits - 1] >= '0' && shard_path[digits - 1] <= '9') --digits;
  if (digits == end || digits == name || shard_path[digits - 1] != '_') return "";
  end = digits - 1;  // the '_' before the digits
  for (const std::string split : {"_train", "_val"}) {
    if (end >= name + split.size() + 1 && shard_path.compare(end - split.size(), split.size(), split) == 0)
      return incomplete_marker_for_prefix(shard_path.substr(0, end - split.size()));
  }
  return "";
}

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t mix(uint64_t x) {  // SplitMix64's finalizer
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t LlmcContentHash::hash_words(const uint8_t* p, size_t n, uint64_t first_word) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the words are little-endian; so must the host be");
  uint64_t sum = 0;
  const size_t words = n / 8;
  uint64_t k = (first_word + 1) * kGolden;
  for (size_t i = 0; i < words; ++i, k += kGolden) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    sum += mix(w + k);
  }
  if (n % 8 != 0) {
    uint64_t w = 0;
    std::memcpy(&w, p + 8 * words, n % 8);
    sum += mix(w + k);
  }
  return sum;
}

uint64_t LlmcContentHash::finish(uint64_t sum, uint64_t bytes) { return sum + mix(bytes); }

void LlmcContentHash::update(const void* bytes, size_t n) {
  const auto* p = static_cast<const uint8_t*>(bytes);
  if (partial_n_ > 0) {
    const size_t take = std::min(n, 8 - partial_n_);
    std::memcpy(partial_ + partial_n_, p, take);
    partial_n_ += take;
    p += take;
    n -= take;
    bytes_ += take;
    if (partial_n_ < 8) return;
    sum_ += hash_words(partial_, 8, (bytes_ - 8) / 8);
    partial_n_ = 0;
  }
  const size_t whole = n - n % 8;
  sum_ += hash_words(p, whole, bytes_ / 8);
  bytes_ += whole;
  partial_n_ = n - whole;
  std::memcpy(partial_, p + whole, partial_n_);
  bytes_ += partial_n_;
}

uint64_t LlmcContentHash::value() const {
  const uint64_t sum = partial_n_ == 0 ? sum_ : sum_ + hash_words(partial_, partial_n_, (bytes_ - partial_n_) / 8);
  return finish(sum, bytes_);
}

int llmc_token_bits(int64_t vocab_size) {
  ST_CHECK(vocab_size > 0, "vocab_size = ", vocab_size);
  return vocab_size <= kLlmcU16Vocab ? 16 : 32;
}

}  // namespace st
