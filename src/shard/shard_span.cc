#include "shardtrain/shard/shard_span.h"

#include <algorithm>

#include "shardtrain/core/error.h"

namespace st {

int64_t padded_shard_size(int64_t numel, int world) {
  ST_CHECK(numel >= 0 && world >= 1, "numel ", numel, ", world ", world);
  return (numel + world - 1) / world;
}

ShardSpan shard_span(int64_t numel, int rank, int world) {
  ST_CHECK(rank >= 0 && rank < world, "rank ", rank, " outside world ", world);
  const int64_t slot = padded_shard_size(numel, world);
  const int64_t begin = std::min(numel, slot * rank);
  const int64_t end = std::min(numel, slot * (rank + 1));
  return ShardSpan{begin, end - begin};
}

ShardSpan intersect(const ShardSpan& a, const ShardSpan& b) {
  const int64_t lo = std::max(a.offset, b.offset), hi = std::min(a.end(), b.end());
  return hi > lo ? ShardSpan{lo, hi - lo} : ShardSpan{lo, 0};
}

}  // namespace st
