// The steps of train.fp8=delayed's scales (model/fp8_history.h) on maxima as fp8_maxima writes them: the bits of
// non-negative floats, which order as the floats do (a NaN's or an infinity's above every finite one). These are the
// CPU references; kernels/gpu/fp8_history.h launches the same operations on device buffers.
//
//   fp8_delayed_maxima(own, step, history_max, applied, n, record);  // each cast: what it scales by
//   fp8_max_over_ranks(gathered, world, n, entry);                    // the step's end: every rank's maxima
//   fp8_history_push(entry, n, ring, length, slot, filled, history_max, step);
#pragma once

#include <cstdint>

namespace st {

// For each of n operands: its own maximum own[i] folded into the step's maxima step[i] when `record`, and the maximum
// its cast scales by, applied[i]: history_max[i], or own[i] where that is 0 (an empty history, or one of zeros) or
// where own[i] is not finite (so that the cast turns NaN, as a tensorwise cast of the operand would, and the step is
// skipped, instead of saturating an infinity under the history's scale). The rule of a cast that knows its operand's
// own maximum before it casts (the CPU backend's; the GPU's where a producer took the maximum). A cast that takes its
// scale ahead and the maximum as it reads (fp8_quantize_ahead, the SwiGLU's fused casts) scales by 1 where the
// history's is 0, and turns only the non-finite elements NaN: the same bits wherever the history's maximum is > 0 and
// the operand finite.
void fp8_delayed_maxima(const unsigned* own, unsigned* step, const unsigned* history_max, unsigned* applied, int64_t n,
                        bool record);

// out[i] = the largest of gathered[r * n + i] over the world ranks' rows. out may be gathered's first row.
void fp8_max_over_ranks(const unsigned* gathered, int world, int64_t n, unsigned* out);

// A step's maxima entry[0, n) become slot `slot` of ring [length, n]; history_max[i] becomes the largest of the
// `filled` newest slots' (slot, slot - 1, ... modulo length, this one counted; 1 <= filled <= length); step[0, n) is
// zeroed. entry may be step.
void fp8_history_push(const unsigned* entry, int64_t n, unsigned* ring, int length, int slot, int filled,
                      unsigned* history_max, unsigned* step);

}  // namespace st
