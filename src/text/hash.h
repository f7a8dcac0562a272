// Hashing for the tokenizer's tables: byte strings (words, vocabulary entries) and id pairs (merges). Fast on the
// short keys they hold (a word is a few bytes); not stable across builds, nothing stores it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace st::text {

inline uint64_t hash_mix(uint64_t x) {
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return x;
}

inline uint64_t hash_bytes(const char* p, size_t n) {
  constexpr uint64_t kMul = 0x9e3779b97f4a7c15ull;
  uint64_t h = kMul ^ (n * 0xff51afd7ed558ccdull);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
  }
  return hash_mix(h);
}

}  // namespace st::text
