#include "shardtrain/kernels/fp8_history.h"

#include <algorithm>

#include "shardtrain/core/error.h"

namespace st {

namespace {
constexpr unsigned kNonFiniteBits = 0x7f800000u;  // an infinity's: every non-finite maximum is at or above
}  // namespace

void fp8_delayed_maxima(const unsigned* own, unsigned* step, const unsigned* history_max, unsigned* applied, int64_t n,
                        bool record) {
  for (int64_t i = 0; i < n; ++i) {
    if (record) step[i] = std::max(step[i], own[i]);
    // A non-finite own maximum (bits at or above an infinity's) is applied as it is, so that the cast turns NaN as
    // tensorwise's does and the step is skipped, rather than saturating under the history's finite scale.
    applied[i] = history_max[i] != 0 && own[i] < kNonFiniteBits ? history_max[i] : own[i];
  }
}

void fp8_max_over_ranks(const unsigned* gathered, int world, int64_t n, unsigned* out) {
  ST_CHECK(world >= 1 && n >= 0, "fp8_max_over_ranks: world ", world, ", n ", n);
  for (int64_t i = 0; i < n; ++i) {
    unsigned m = gathered[i];
    for (int r = 1; r < world; ++r) m = std::max(m, gathered[r * n + i]);
    out[i] = m;
  }
}

void fp8_history_push(const unsigned* entry, int64_t n, unsigned* ring, int length, int slot, int filled,
                      unsigned* history_max, unsigned* step) {
  ST_CHECK(length >= 1 && slot >= 0 && slot < length && filled >= 1 && filled <= length && n >= 0,
           "fp8_history_push: slot ", slot, ", filled ", filled, ", length ", length, ", n ", n);
  for (int64_t i = 0; i < n; ++i) {
    const unsigned e = entry[i];
    ring[slot * n + i] = e;
    unsigned m = e;
    for (int k = 1; k < filled; ++k) m = std::max(m, ring[((slot - k + length) % length) * n + i]);
    history_max[i] = m;
    step[i] = 0;
  }
}

}  // namespace st
