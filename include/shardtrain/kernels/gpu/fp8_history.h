// kernels/fp8_history.h's operations on the device, launched on ctx.stream without waiting (no scratch): the same
// operands and the CPU references' bits.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/fp8_history.h"
#include "shardtrain/kernels/gpu/context.h"

namespace st::gpu {

void fp8_delayed_maxima(const unsigned* own, unsigned* step, const unsigned* history_max, unsigned* applied, int64_t n,
                        bool record, const GpuContext& ctx);
void fp8_max_over_ranks(const unsigned* gathered, int world, int64_t n, unsigned* out, const GpuContext& ctx);
void fp8_history_push(const unsigned* entry, int64_t n, unsigned* ring, int length, int slot, int filled,
                      unsigned* history_max, unsigned* step, const GpuContext& ctx);

}  // namespace st::gpu
