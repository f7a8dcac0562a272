#include "shardtrain/kernels/reduce.h"

#include "shardtrain/core/error.h"

namespace st {

void accumulate_parts(float* acc, const float* parts, int nparts, int64_t stride, int64_t n, GradWrite write) {
  ST_CHECK(nparts >= 1 && n >= 0 && stride >= n, "accumulate_parts: ", nparts, " parts of ", n, " at stride ",
           stride);
  for (int64_t i = 0; i < n; ++i) {
    float s = parts[i];
    for (int q = 1; q < nparts; ++q) s += parts[q * stride + i];
    acc[i] = write == GradWrite::kOverwrite ? s : acc[i] + s;
  }
}

}  // namespace st
