#include "shardtrain/core/rng.h"

#include <cmath>

namespace st {

double normal_at(uint64_t seed, uint64_t stream, uint64_t index) {
  // Two uniforms from disjoint halves of the counter space of this (seed, stream).
  const double u1 = uniform_at(seed, stream, 2 * index);
  const double u2 = uniform_at(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t Rng::next_below(uint64_t n) {
  const unsigned __int128 wide = static_cast<unsigned __int128>(next_u64()) * n;
  return static_cast<uint64_t>(wide >> 64);
}

}  // namespace st
