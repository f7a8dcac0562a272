#include "bpe.h"

#include <algorithm>
#include <cstring>

namespace st::text {
namespace {

// Rescans all pairs for the lowest rank after every merge: for short words this beats any heap, since the pairs
// fit in a few cache lines and nothing is allocated.
int merge_by_scan(const MergeTable& merges, int32_t* ids, int n) {
  uint32_t rank[kBpeScanMax];
  int32_t merged[kBpeScanMax];
  for (int i = 0; i + 1 < n; ++i) {
    const MergeTable::Merge m = merges.find(ids[i], ids[i + 1]);
    rank[i] = m.rank;
    merged[i] = m.merged;
  }
  while (n > 1) {
    uint32_t best = MergeTable::kNoRank;
    int at = -1;
    for (int i = 0; i + 1 < n; ++i) {
      if (rank[i] < best) {  // strict: the leftmost of equal ranks
        best = rank[i];
        at = i;
      }
    }
    if (at < 0) break;
    ids[at] = merged[at];
    // Drop symbol at+1 and pair at+1 (it joined the dropped symbol to its right neighbour).
    std::memmove(ids + at + 1, ids + at + 2, sizeof(int32_t) * (n - at - 2));
    if (n - at - 3 > 0) {
      std::memmove(rank + at + 1, rank + at + 2, sizeof(uint32_t) * (n - at - 3));
      std::memmove(merged + at + 1, merged + at + 2, sizeof(int32_t) * (n - at - 3));
    }
    --n;
    if (at > 0) {
      const MergeTable::Merge m = merges.find(ids[at - 1], ids[at]);
      rank[at - 1] = m.rank;
      merged[at - 1] = m.merged;
    }
    if (at + 1 < n) {
      const MergeTable::Merge m = merges.find(ids[at], ids[at + 1]);
      rank[at] = m.rank;
      merged[at] = m.merged;
    }
  }
  return n;
}

// Hugging Face's Word::merge_all: a min-heap of (rank, position) over a doubly linked list of symbols.
int merge_by_heap(const MergeTable& merges, int32_t* ids, int n, BpeScratch* scratch) {
  using Candidate = BpeScratch::Candidate;
  auto& sym = scratch->symbols;
  auto& heap = scratch->heap;
  sym.resize(n);
  heap.clear();
  // std::push_heap keeps the largest on top: "larger" here is the higher rank, then the position further right.
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  const auto push = [&](int32_t pos, int32_t left, int32_t right) {
    const MergeTable::Merge m = merges.find(left, right);
    if (m.rank == MergeTable::kNoRank) return;
    heap.push_back(Candidate{m.rank, pos, m.merged});
    std::push_heap(heap.begin(), heap.end(), later);
  };
  for (int i = 0; i < n; ++i) sym[i] = BpeScratch::Symbol{ids[i], i - 1, i + 1 < n ? i + 1 : -1, true};
  for (int i = 0; i + 1 < n; ++i) push(i, ids[i], ids[i + 1]);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate top = heap.back();
    heap.pop_back();
    BpeScratch::Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    BpeScratch::Symbol& right = sym[left.next];
    const MergeTable::Merge now = merges.find(left.id, right.id);
    if (now.rank == MergeTable::kNoRank || now.merged != top.merged) continue;  // stale: the pair has changed
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (left.prev >= 0) push(left.prev, sym[left.prev].id, left.id);
    if (left.next >= 0) push(top.pos, left.id, sym[left.next].id);
  }
  int out = 0;
  for (int i = 0; i >= 0; i = sym[i].next) ids[out++] = sym[i].id;
  return out;
}

}  // namespace

MergeTable::MergeTable(size_t n) {
  size_t capacity = 16;
  while (capacity < n * 2) capacity *= 2;
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
}

void MergeTable::insert(int32_t left, int32_t right, uint32_t rank, int32_t merged) {
  if ((size_ + 1) * 2 > slots_.size()) grow();
  const uint64_t key = pair_key(left, right);
  uint64_t s = hash_mix(key) & mask_;
  while (slots_[s].key != kEmpty && slots_[s].key != key) s = (s + 1) & mask_;
  if (slots_[s].key == kEmpty) ++size_;
  slots_[s] = Slot{key, rank, merged};
}

void MergeTable::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.size() * 2, Slot{});
  mask_ = slots_.size() - 1;
  for (const Slot& slot : old) {
    if (slot.key == kEmpty) continue;
    uint64_t s = hash_mix(slot.key) & mask_;
    while (slots_[s].key != kEmpty) s = (s + 1) & mask_;
    slots_[s] = slot;
  }
}

int bpe_merge(const MergeTable& merges, int32_t* ids, int n, BpeScratch* scratch) {
  if (n < 2) return n;
  return n <= kBpeScanMax ? merge_by_scan(merges, ids, n) : merge_by_heap(merges, ids, n, scratch);
}

}  // namespace st::text
