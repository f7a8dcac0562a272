// A copy of this rank's checkpointed state, taken at a step boundary, that a background thread writes while
// training goes on: for every unit, the owned elements of the fp32 master weights and the two AdamW moments.
//
//   StateSnapshot snap;
//   model.snapshot_state(&snap);   // main thread, between steps: starts (or makes) the copy
//   ... training continues ...
//   snap.wait();                   // any thread: the copy is complete
//   write(snap.units);             // the arrays hold the state of the step the snapshot was taken at
//
// The memory is kept from one snapshot to the next (a device backend pins it, once), so a snapshot may be taken
// again only when nobody reads the previous one any more.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/shard/shard_span.h"

namespace st {

struct StateSnapshot {
  struct Unit {
    std::string name;
    ShardSpan span;  // the unit's owned elements; each array holds span.count floats
    const float* param = nullptr;
    const float* exp_avg = nullptr;
    const float* exp_avg_sq = nullptr;
  };
  std::vector<Unit> units;

  // Blocks until every array holds the snapshot's values. Callable from any thread, any number of times.
  void wait() const {
    if (ready) ready();
  }
  // Bytes of state the snapshot holds (3 x 4 B x the owned elements).
  int64_t state_bytes() const {
    int64_t n = 0;
    for (const Unit& u : units) n += 12 * u.span.count;
    return n;
  }

  // Filled by the backend: the storage the arrays point into (floats, `capacity` of them) and the wait for an
  // asynchronous copy (empty when the copy was made synchronously).
  std::shared_ptr<float> storage;
  int64_t capacity = 0;
  std::function<void()> ready;
  // Set where arrays point into the live state (a device backend's offloaded units, which live in host memory): the
  // writer calls it once it no longer reads them, and the state's next updates wait until then. Called once.
  std::function<void()> release;
};

}  // namespace st
