// An immutable map from byte strings to ids, built once at load: the vocabulary by raw bytes, which the encoder
// looks whole words up in (ignore_merges). Open addressing over one arena, so a lookup is one hash and, on a hit,
// one memcmp.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace st::text {

class StringTable {
 public:
  // `keys[i]` maps to `ids[i]`; keys are distinct.
  StringTable(const std::vector<std::string>& keys, const std::vector<int32_t>& ids);
  StringTable() = default;

  // The id of `key`, or -1.
  int32_t find(std::string_view key) const;

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0;
    uint32_t length = 0;
    int32_t id = -1;  // -1: empty
  };
  std::vector<Slot> slots_;
  std::string arena_;
  uint64_t mask_ = 0;
};

}  // namespace st::text
