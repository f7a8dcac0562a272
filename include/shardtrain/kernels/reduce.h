// Reductions of the sharded model on the host, the references of kernels/gpu/reduce.h's.
#pragma once

#include <cstdint>

#include "shardtrain/kernels/grad_write.h"

namespace st {

// Accumulates: acc[i] += ((parts[i] + parts[stride + i]) + parts[2 * stride + i]) + ..., over nparts parts (at
// least 1) in index order, in fp32; with GradWrite::kOverwrite, acc[i] = that sum. A rank's shard of a gradient
// from the slices every rank sent it (an all-to-all's output, rank order), as a reduce-scatter would give it.
void accumulate_parts(float* acc, const float* parts, int nparts, int64_t stride, int64_t n,
                      GradWrite write = GradWrite::kAccumulate);

}  // namespace st
