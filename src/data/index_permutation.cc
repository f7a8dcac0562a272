#include "shardtrain/data/index_permutation.h"

#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"

namespace st {
namespace {

// Four rounds already make a Feistel network a pseudo-random permutation (Luby-Rackoff); six leave a
// margin for the small domains where the halves are only a few bits wide.
constexpr int kRounds = 6;

int bit_width(uint64_t x) {
  int b = 0;
  while (x != 0) {
    ++b;
    x >>= 1;
  }
  return b;
}

}  // namespace

IndexPermutation::IndexPermutation(uint64_t n, uint64_t key) : n_(n), key_(key) {
  ST_CHECK(n_ >= 1, "IndexPermutation over an empty range");
  const int bits = bit_width(n_ - 1);  // values 0 .. n-1 fit in `bits` bits
  half_bits_ = bits <= 1 ? 1 : (bits + 1) / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
}

uint64_t IndexPermutation::encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t next = left ^ (random_bits_at(key_, static_cast<uint64_t>(r), right) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t IndexPermutation::operator()(uint64_t i) const {
  ST_CHECK(i < n_, "index ", i, " outside a permutation of ", n_);
  if (n_ == 1) return 0;
  uint64_t y = encrypt(i);
  while (y >= n_) y = encrypt(y);
  return y;
}

}  // namespace st
