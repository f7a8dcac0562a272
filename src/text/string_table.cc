#include "string_table.h"

#include "hash.h"
#include "shardtrain/core/error.h"

namespace st::text {

StringTable::StringTable(const std::vector<std::string>& keys, const std::vector<int32_t>& ids) {
  ST_CHECK(keys.size() == ids.size());
  size_t capacity = 16;
  while (capacity < keys.size() * 2) capacity *= 2;  // load factor at most 1/2
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  size_t bytes = 0;
  for (const std::string& k : keys) bytes += k.size();
  arena_.reserve(bytes);
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::string& k = keys[i];
    const uint64_t h = hash_bytes(k.data(), k.size());
    uint64_t s = h & mask_;
    while (slots_[s].id >= 0) s = (s + 1) & mask_;
    slots_[s] = Slot{h, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(k.size()), ids[i]};
    arena_ += k;
  }
}

int32_t StringTable::find(std::string_view key) const {
  if (slots_.empty()) return -1;
  const uint64_t h = hash_bytes(key.data(), key.size());
  for (uint64_t s = h & mask_;; s = (s + 1) & mask_) {
    const Slot& slot = slots_[s];
    if (slot.id < 0) return -1;
    if (slot.hash == h && slot.length == key.size() && arena_.compare(slot.offset, slot.length, key) == 0) {
      return slot.id;
    }
  }
}

}  // namespace st::text
