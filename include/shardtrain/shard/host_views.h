// A model's state as a loader sees it, one unit at a time: the unit list, the ranks the loaders agree over, and each
// unit's host view (UnitShard) between pull_unit and push_unit. ModelBackend is one (model_backend.h: this rank's
// shards, whatever the device); the full weights of one process that decoding reads (ckpt/decode_weights.h) are
// another. init.from (ckpt/init_from.h) loads into either.
//
//   UnitShard& sh = views.shard(u);                                    // span and slot: valid at any time
//   const OwnedRange r = owned_range(sh, views.units()[u], offset, n);  // the part of a tensor this rank holds
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/model/units.h"
#include "shardtrain/shard/shard_span.h"

namespace st {

// One unit's state on this rank. Vectors hold `slot` elements: the first span.count are the owned
// elements [span.offset, span.end()) of the unit; the rest is padding that stays zero.
struct UnitShard {
  ShardSpan span;
  int64_t slot = 0;  // padded_shard_size(numel, world)
  std::vector<float> param, grad, m, v;
  // The unit's frozen tensors (LoRA's base; units.h): this rank's span of [0, frozen_numel) of the frozen segment,
  // in fp32 in the host view (the backend's storage holds them in lora.base_dtype). Empty without frozen tensors.
  ShardSpan frozen_span;
  int64_t frozen_slot = 0;
  std::vector<float> frozen;
  // An NF4 unit (unit.nf4_base; model/nf4_base.h) shards its NF4 storage instead, in 4-byte words: this rank's span
  // of them and its slot (nf4_words holds them on the CPU backend; a device backend holds them on the device). Its
  // frozen_span is then the whole segment and frozen_slot 0: between pull_unit and push_unit the view `frozen` holds
  // every frozen weight, unwritten_frozen() until a loader writes them, and the push quantises what it holds.
  ShardSpan nf4_span;
  int64_t nf4_slot = 0;
  std::vector<float> nf4_words;
};

// Elements [offset, offset + count) of a unit's flat buffer (one tensor's, so wholly trainable or wholly frozen,
// units.h) as this rank holds them in `sh`'s host view: the part it owns, in the unit's flat coordinates, and where
// the view keeps element `part.offset` (in param for trainable elements, in frozen for frozen ones; null when the
// part is empty or the view is not filled).
struct OwnedRange {
  ShardSpan part;
  float* data = nullptr;
};
OwnedRange owned_range(UnitShard& sh, const UnitLayout& unit, int64_t offset, int64_t count);

class HostViews {
 public:
  virtual ~HostViews() = default;

  virtual const std::vector<UnitLayout>& units() const = 0;
  // The ranks that load together: a loader's ranks agree over it on what they found (a backend's world).
  virtual Communicator& comm() = 0;
  // The unit's host view. span and slot are valid at any time; param, m and v hold the unit's state between
  // pull_unit(unit) and push_unit(unit) or release_unit(unit). A checkpoint load, init.from and a synchronous save go
  // through the units one at a time, so that a device backend holds one unit's view on the host at once:
  //   model.pull_unit(u);      // shard(u).param, m, v = the unit's state
  //   ... read or overwrite the owned elements of shard(u) ...
  //   model.push_unit(u);      // what shard(u) holds becomes the state; or release_unit(u) when nothing changed
  // On the CPU the view is the state and all three do nothing. A device backend first waits for everything that
  // writes the unit (its streams, the optimizer, the offload pipeline); pull_unit fills the view of that unit only,
  // push_unit uploads it, and both push_unit and release_unit free it (an offloaded unit's view is its host state
  // itself, read and written in place and never freed). Not collective.
  virtual UnitShard& shard(int unit) = 0;
  virtual void pull_unit(int unit) {}
  virtual void push_unit(int unit) {}
  virtual void release_unit(int unit) {}
};

}  // namespace st
