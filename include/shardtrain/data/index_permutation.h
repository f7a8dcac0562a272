// IndexPermutation: a seeded bijection on [0, n) that needs O(1) memory and O(1) expected time per
// lookup, so an epoch of billions of windows can be shuffled without a table (std::shuffle of an index
// array would cost 8 bytes per window and a full pass per epoch).
//
// Construction: a balanced 6-round Feistel network over 2h bits, 2^(2h) the smallest even power of two
// >= n (so at most 4n), round function F_r(R) = random_bits_at(key, r, R) masked to h bits, and
// cycle-walking: re-encrypt until the value falls in [0, n). Every step is a bijection on [0, 2^(2h)), so
// the walk stays on i's cycle and must come back into [0, n): the result is a bijection on [0, n).
//
//   st::IndexPermutation p(/*n=*/1000, /*key=*/42);
//   uint64_t j = p(7);   // in [0, 1000); p(i) != p(k) for i != k
#pragma once

#include <cstdint>

namespace st {

class IndexPermutation {
 public:
  // n >= 1.
  IndexPermutation(uint64_t n, uint64_t key);

  // The image of i, for i < n (an internal error otherwise).
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t encrypt(uint64_t x) const;

  uint64_t n_;
  uint64_t key_;
  int half_bits_;
  uint64_t half_mask_;
};

}  // namespace st
