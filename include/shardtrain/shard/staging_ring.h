// The pinned staging memory of optimizer offload without speculation (offload_pipeline.h): one ring of bytes that
// the offloaded units pass through in turn, instead of a gradient and a result buffer per unit. A unit's space
// carries its gradient shard down (fp32) and, with optim.offload=optimizer, the host AdamW's rounded parameters back
// up; it is taken when the unit's copy down is issued and given back, oldest first, once its job has finished and
// its copy up has landed. The ring holds two of the largest unit's spaces: any unit fits once the ring is empty, and
// units of equal size (the blocks) are in flight two or more at a time, one copying while the host AdamW works on
// another.
//
// Host code (the host plan uses the same sizes); the pipeline owns the memory and the synchronisation.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>

#include "shardtrain/core/config.h"
#include "shardtrain/core/error.h"

namespace st {

inline constexpr int64_t kStagingAlignment = 4096;

inline int64_t staging_align(int64_t bytes) {
  return (bytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
}

// The ring space of one offloaded unit whose shard has `slot` elements: the gradient in fp32 and, with the
// parameters on the device (optim.offload=optimizer), their copy up in the compute type (`compute_bytes` each).
inline int64_t staging_unit_bytes(int64_t slot, int64_t compute_bytes, OffloadMode mode) {
  return staging_align(4 * slot) + (mode == OffloadMode::kOptimizer ? staging_align(compute_bytes * slot) : 0);
}

// The ring's size: two of the largest unit's spaces.
inline int64_t staging_ring_bytes(int64_t max_slot, int64_t compute_bytes, OffloadMode mode) {
  return 2 * staging_unit_bytes(max_slot, compute_bytes, mode);
}

// First-in first-out allocation of contiguous byte ranges in [0, capacity): take() places a range after the newest
// one, or at 0 when the tail has too little room, and release_oldest() gives back the oldest.
class StagingRing {
 public:
  explicit StagingRing(int64_t capacity) : capacity_(capacity) {}

  int64_t capacity() const { return capacity_; }
  bool empty() const { return taken_.empty(); }

  // The offset of `bytes` contiguous bytes, or nothing while the oldest ranges still hold the room they need.
  std::optional<int64_t> take(int64_t bytes) {
    ST_CHECK(bytes > 0 && bytes <= capacity_, "staging ring: ", bytes, " bytes asked of a ring of ", capacity_);
    if (taken_.empty()) return push(0, bytes);
    const int64_t head = taken_.back().offset + taken_.back().bytes;  // the end of the newest range
    const int64_t tail = taken_.front().offset;                       // the start of the oldest
    if (taken_.back().offset >= tail) {
      // [tail, head) is in use: room after head, else from 0 up to tail.
      if (capacity_ - head >= bytes) return push(head, bytes);
      if (tail >= bytes) return push(0, bytes);
      return std::nullopt;
    }
    // Wrapped: [tail, ...) and [0, head) are in use; the room is [head, tail).
    if (tail - head >= bytes) return push(head, bytes);
    return std::nullopt;
  }

  void release_oldest() {
    ST_CHECK(!taken_.empty(), "staging ring: release_oldest with nothing taken");
    taken_.pop_front();
  }

 private:
  struct Range {
    int64_t offset, bytes;
  };
  int64_t push(int64_t offset, int64_t bytes) {
    taken_.push_back({offset, bytes});
    return offset;
  }
  int64_t capacity_;
  std::deque<Range> taken_;
};

}  // namespace st
