#include "word_cache.h"

#include <algorithm>

namespace st::text {

WordCache::WordCache() = default;

const int32_t* WordCache::Table::add(std::string_view word, uint64_t hash, const int32_t* word_ids, int n) {
  uint64_t s = hash & kMask;
  while (slots[s].n_ids != 0) s = (s + 1) & kMask;
  slots[s] = Slot{hash, static_cast<uint32_t>(keys.size()), static_cast<uint32_t>(ids.size()),
                  static_cast<uint16_t>(word.size()), static_cast<uint16_t>(n)};
  keys.append(word);
  ids.insert(ids.end(), word_ids, word_ids + n);
  ++words;
  return ids.data() + slots[s].ids_offset;
}

void WordCache::Table::clear() {
  std::fill(slots.begin(), slots.end(), Slot{});
  keys.clear();
  ids.clear();
  words = 0;
}

WordCache::Table& WordCache::room_for(size_t word_bytes, int n) {
  if (!tables_[current_].has_room(word_bytes, n)) {
    current_ = 1 - current_;
    tables_[current_].clear();
  }
  return tables_[current_];
}

const int32_t* WordCache::promote(std::string_view word, uint64_t hash, const int32_t* ids, int n) {
  // `ids` (and `word`'s copy in the previous table) die if the turnover empties that table: keep the ids aside.
  promoted_.assign(ids, ids + n);
  return room_for(word.size(), n).add(word, hash, promoted_.data(), n);
}

void WordCache::insert(std::string_view word, uint64_t hash, const int32_t* ids, int n) {
  if (word.size() > kMaxWordBytes || n <= 0) return;
  int existing = 0;
  if (tables_[current_].find(word, hash, &existing) != nullptr) return;
  room_for(word.size(), n).add(word, hash, ids, n);
}

}  // namespace st::text
