// Which slice of a unit's flat buffer a rank owns.
//
// A unit of `numel` elements is cut into `world` slots of padded_shard_size(numel, world) = ceil(numel /
// world) elements each; rank r owns the part of slot r that lies inside the unit. So every rank's span
// is contiguous, spans are disjoint and cover [0, numel), trailing ranks may own fewer elements or none
// (numel < world), and the padding exists only in memory: each rank stores a full slot so that an
// all-gather of the slots is the unit's flat buffer followed by at most world - 1 padding elements.
//
//   shard_span(10, /*rank=*/3, /*world=*/4)  ->  {offset 9, count 1}     (slots of 3: 0-2, 3-5, 6-8, 9)
//   shard_span(2, 3, 4)                      ->  {offset 2, count 0}     (empty)
#pragma once

#include <cstdint>

namespace st {

struct ShardSpan {
  int64_t offset = 0;  // first element, in the unit's flat buffer
  int64_t count = 0;   // elements owned (0 for an empty span)

  int64_t end() const { return offset + count; }
  bool empty() const { return count == 0; }
  bool operator==(const ShardSpan& o) const { return offset == o.offset && count == o.count; }
};

// ceil(numel / world); 0 when numel == 0. Needs numel >= 0 and world >= 1.
int64_t padded_shard_size(int64_t numel, int world);

// The span rank owns (0 <= rank < world).
ShardSpan shard_span(int64_t numel, int rank, int world);

// The part of `a` that lies in `b` (count 0 if they do not meet). Resharding reads by intersection.
ShardSpan intersect(const ShardSpan& a, const ShardSpan& b);

}  // namespace st
