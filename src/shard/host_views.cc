#include "shardtrain/shard/host_views.h"

#include "shardtrain/core/error.h"

namespace st {

OwnedRange owned_range(UnitShard& sh, const UnitLayout& unit, int64_t offset, int64_t count) {
  const bool frozen = offset >= unit.numel && unit.frozen_numel > 0;
  ST_CHECK(frozen ? offset + count <= unit.numel + unit.frozen_numel : offset + count <= unit.numel, "range [", offset,
           ", +", count, ") crosses the trainable and frozen tensors of ", unit.name);
  const int64_t base = frozen ? unit.numel : 0;  // the segment's first element in the flat buffer
  const ShardSpan& span = frozen ? sh.frozen_span : sh.span;
  std::vector<float>& view = frozen ? sh.frozen : sh.param;
  ShardSpan part = intersect(span, ShardSpan{offset - base, count});
  OwnedRange r;
  r.part = ShardSpan{part.offset + base, part.count};
  if (part.count > 0 && !view.empty()) r.data = view.data() + (part.offset - span.offset);
  return r;
}

}  // namespace st
