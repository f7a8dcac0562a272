// The ids of recently encoded words, so that a frequent word is merged once: the role of Hugging Face's BPE cache,
// but one per thread, so that it needs no lock.
//
// Bounded by generations: words go into the current table; when it holds kMaxWords words (or its arenas reach
// their budget) the previous table is emptied and becomes the current one. A word found in the previous table is
// copied into the current one, so the words in use survive every turnover and only those unused for a whole
// generation are dropped. Words longer than kMaxWordBytes are not cached. At most about 8 MiB a thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace st::text {

class WordCache {
 public:
  static constexpr int kMaxWordBytes = 255;
  static constexpr size_t kMaxWords = size_t{1} << 15;  // a generation

  WordCache();

  // The ids of `word` (whose hash_bytes is `hash`) and their count in *n, or nullptr if it is not cached. The
  // pointer is valid until the next find() or insert().
  const int32_t* find(std::string_view word, uint64_t hash, int* n) {
    const int32_t* ids = tables_[current_].find(word, hash, n);
    if (ids != nullptr) return ids;
    ids = tables_[1 - current_].find(word, hash, n);
    if (ids == nullptr) return nullptr;
    return promote(word, hash, ids, *n);
  }

  // Remembers the `n` (>= 1) ids of `word`; a word longer than kMaxWordBytes is ignored.
  void insert(std::string_view word, uint64_t hash, const int32_t* ids, int n);

 private:
  static constexpr size_t kSlots = kMaxWords * 2;  // load factor at most 1/2
  static constexpr uint64_t kMask = kSlots - 1;
  static constexpr size_t kMaxArenaBytes = size_t{1} << 20;

  struct Slot {
    uint64_t hash = 0;
    uint32_t word_offset = 0;
    uint32_t ids_offset = 0;
    uint16_t word_len = 0;
    uint16_t n_ids = 0;  // 0: empty
  };

  struct Table {
    std::vector<Slot> slots = std::vector<Slot>(kSlots);
    std::string keys;
    std::vector<int32_t> ids;
    size_t words = 0;

    const int32_t* find(std::string_view word, uint64_t hash, int* n) const {
      for (uint64_t s = hash & kMask;; s = (s + 1) & kMask) {
        const Slot& slot = slots[s];
        if (slot.n_ids == 0) return nullptr;
        if (slot.hash == hash && slot.word_len == word.size() &&
            keys.compare(slot.word_offset, slot.word_len, word) == 0) {
          *n = slot.n_ids;
          return ids.data() + slot.ids_offset;
        }
      }
    }
    bool has_room(size_t word_bytes, int n) const {
      return words < kMaxWords && keys.size() + word_bytes <= kMaxArenaBytes &&
             (ids.size() + n) * sizeof(int32_t) <= kMaxArenaBytes;
    }
    // Adds a word that is not in the table and fits; returns its ids' place.
    const int32_t* add(std::string_view word, uint64_t hash, const int32_t* word_ids, int n);
    void clear();
  };

  const int32_t* promote(std::string_view word, uint64_t hash, const int32_t* ids, int n);
  Table& room_for(size_t word_bytes, int n);

  Table tables_[2];
  int current_ = 0;
  std::vector<int32_t> promoted_;  // a promoted word's ids while its old table is emptied
};

}  // namespace st::text
