// Random operands on the host: the CPU reference of gpu::fill_uniform (kernels/gpu/fill.h).
#pragma once

#include <cstdint>

namespace st {

// out[i] = st::uniform_pm1_at(seed, i): uniform in [-1, 1), a pure function of (seed, i) (core/rng.h).
void fill_uniform(float* out, int64_t n, uint64_t seed);

}  // namespace st
