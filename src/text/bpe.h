// Byte-pair merging over token ids: the merge table and the merge loop of a BPE model.
//
// A word starts as one id a byte; while some adjacent pair has a merge, the pair with the lowest rank is replaced by
// its merged id, the leftmost first among equal pairs. This is Hugging Face's Word::merge_all without dropout, whose
// heap pops (rank, position) minima and skips entries made stale by an earlier merge; the two orders agree because a
// pair's rank is unique and a stale entry can never match its position's new pair (the new pair spans more bytes,
// so it has a different merged id).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hash.h"

namespace st::text {

class MergeTable {
 public:
  static constexpr uint32_t kNoRank = UINT32_MAX;
  struct Merge {
    uint32_t rank;   // kNoRank: the pair does not merge
    int32_t merged;  // the id of the merged token
  };

  MergeTable() = default;
  // Room for `n` merges without growing.
  explicit MergeTable(size_t n);

  // Adds (left, right) -> merged at `rank`; a pair given twice keeps the later rank and id, as Hugging Face's
  // merge map (built by collecting into a hash map) does.
  void insert(int32_t left, int32_t right, uint32_t rank, int32_t merged);

  Merge find(int32_t left, int32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (uint64_t s = hash_mix(key) & mask_;; s = (s + 1) & mask_) {
      const Slot& slot = slots_[s];
      if (slot.key == key) return Merge{slot.rank, slot.merged};
      if (slot.key == kEmpty) return Merge{kNoRank, -1};
    }
  }

  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are below 2^31, so no pair has this key
  static uint64_t pair_key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  void grow();

  struct Slot {
    uint64_t key = kEmpty;
    uint32_t rank = kNoRank;
    int32_t merged = -1;
  };
  std::vector<Slot> slots_ = std::vector<Slot>(16);
  uint64_t mask_ = 15;
  size_t size_ = 0;
};

// Reusable memory of bpe_merge for long words (one per thread).
struct BpeScratch {
  struct Symbol {
    int32_t id;
    int32_t prev;  // -1: none
    int32_t next;  // -1: none
    bool alive;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t merged;
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

// Words up to this many bytes merge by rescanning the pairs (quadratic, with no allocation and no heap); longer ones
// through a heap over a linked list (n log n).
inline constexpr int kBpeScanMax = 64;

// Merges the `n` ids at `ids` in place; returns how many remain (the merged word is ids[0..returned)).
int bpe_merge(const MergeTable& merges, int32_t* ids, int n, BpeScratch* scratch);

}  // namespace st::text
