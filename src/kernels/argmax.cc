#include "shardtrain/kernels/argmax.h"

#include <cmath>

namespace st {

void argmax_rows(const float* logits, int64_t ld, int rows, int V, int32_t* tokens) {
  for (int r = 0; r < rows; ++r) {
    const float* row = logits + r * ld;
    int32_t best = 0;
    for (int i = 0; i < V; ++i) {
      if (!std::isfinite(row[i])) {
        best = -1;
        break;
      }
      if (row[i] > row[best]) best = i;
    }
    tokens[r] = best;
  }
}

}  // namespace st
