#include "shardtrain/kernels/sample.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "sample_noise.h"
#include "shardtrain/core/error.h"

namespace st {

using namespace kernels_internal;  // sample_noise.h

double sample_noise(uint64_t seed, uint64_t index) { return gumbel_noise(seed, index); }

void sample_rows(const float* logits, int64_t ld, int rows, int V, const uint64_t* draws, const SamplingOptions& o,
                 int32_t* tokens) {
  ST_CHECK(rows >= 0 && V >= 1 && ld >= V, "sampling ", rows, " rows of ", V, " logits with a row stride of ", ld);
  ST_CHECK(o.temperature > 0 && std::isfinite(o.temperature) && o.top_k >= 0, "sampling at temperature ", o.temperature,
           " among the top ", o.top_k, " (greedy is argmax_rows)");
  const bool top_k = o.top_k > 0 && o.top_k < V;
  std::vector<int32_t> ids;
  for (int r = 0; r < rows; ++r) {
    const float* row = logits + r * ld;
    tokens[r] = -1;
    if (!std::all_of(row, row + V, [](float v) { return std::isfinite(v); })) continue;
    // The k-th candidate in (logit descending, id ascending) order: a candidate beats or equals it.
    float pivot = 0;
    int32_t pivot_id = V;
    if (top_k) {
      ids.resize(static_cast<size_t>(V));
      std::iota(ids.begin(), ids.end(), 0);
      const auto kth = ids.begin() + (o.top_k - 1);
      std::nth_element(ids.begin(), kth, ids.end(),
                       [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
      pivot = row[*kth];
      pivot_id = *kth;
    }
    const uint64_t first = draws[r] * static_cast<uint64_t>(V);
    double best = -INFINITY;
    int best_id = V;  // none yet: any candidate beats it
    for (int i = 0; i < V; ++i) {
      if (top_k && !(row[i] > pivot || (row[i] == pivot && i <= pivot_id))) continue;
      const double score = sample_score(row[i], o.temperature, o.seed, first + static_cast<uint64_t>(i));
      if (sample_better(score, i, best, best_id)) best = score, best_id = i;
    }
    tokens[r] = best_id;
  }
}

}  // namespace st
