#include "shardtrain/data/llmc_format.h"

#include "shardtrain/core/error.h"

namespace st {

std::string mask_path_for(const std::string& shard_path) {
  constexpr char kBin[] = ".bin";
  constexpr size_t kBinLen = sizeof(kBin) - 1;
  if (shard_path.size() > kBinLen && shard_path.compare(shard_path.size() - kBinLen, kBinLen, kBin) == 0)
    return shard_path.substr(0, shard_path.size() - kBinLen) + ".mask";
  return shard_path + ".mask";
}

int llmc_token_bits(int64_t vocab_size) {
  ST_CHECK(vocab_size > 0, "vocab_size = ", vocab_size);
  return vocab_size <= kLlmcU16Vocab ? 16 : 32;
}

}  // namespace st
