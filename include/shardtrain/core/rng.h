// Counter-based random numbers: every value is a pure function of (seed, stream, index).
//
// That is what makes sharded initialisation world-size independent: a rank that owns elements
// [offset, offset+count) of a unit's flat buffer draws exactly the values one process would have drawn
// for them, without generating the rest. It also makes RNG state trivial to checkpoint: (seed, counter).
//
//   float w = st::normal_at(seed, /*stream=*/unit_index, /*index=*/i) * 0.02f;
#pragma once

#include <cstdint>

#include "shardtrain/core/host_device.h"

namespace st {

// SplitMix64 finaliser: a bijective, well-mixed 64-bit hash.
ST_HOST_DEVICE inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// 64 random bits for (seed, stream, index).
ST_HOST_DEVICE inline uint64_t random_bits_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return mix64(mix64(seed ^ mix64(stream + 0x632BE59BD9B4E019ull)) + index);
}

// Uniform in (0, 1): never exactly 0, so log() is safe.
inline double uniform_at(uint64_t seed, uint64_t stream, uint64_t index) {
  return (static_cast<double>(random_bits_at(seed, stream, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Uniform in [-1, 1) from the top 24 bits: exact in fp32, the same on the host and in a kernel.
ST_HOST_DEVICE inline float uniform_pm1_at(uint64_t seed, uint64_t index) {
  return static_cast<float>(random_bits_at(seed, 0, index) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// Standard normal N(0, 1) by Box-Muller on two independent uniforms of the same index.
double normal_at(uint64_t seed, uint64_t stream, uint64_t index);

// A sequential generator over the same function; its whole state is (seed, stream, counter).
class Rng {
 public:
  Rng(uint64_t seed, uint64_t stream, uint64_t counter = 0) : seed_(seed), stream_(stream), counter_(counter) {}
  uint64_t next_u64() { return random_bits_at(seed_, stream_, counter_++); }
  double next_uniform() { return uniform_at(seed_, stream_, counter_++); }
  // Uniform integer in [0, n), n > 0 (multiply-shift; bias below 2^-32 for n < 2^32).
  uint64_t next_below(uint64_t n);
  uint64_t seed() const { return seed_; }
  uint64_t stream() const { return stream_; }
  uint64_t counter() const { return counter_; }

 private:
  uint64_t seed_;
  uint64_t stream_;
  uint64_t counter_;
};

}  // namespace st
