#include "shardtrain/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"

namespace st {

void check_sampling_options(const SamplingOptions& o) {
  if (!(o.temperature >= 0.0) || !std::isfinite(o.temperature))
    ST_BAD_INPUT("temperature ", o.temperature, " is out of range: expected a finite number >= 0 (0: greedy)");
  if (o.top_k < 0) ST_BAD_INPUT("top_k ", o.top_k, " is out of range: expected >= 0 (0: every token)");
}

int32_t argmax_token(const std::vector<float>& logits) {
  ST_CHECK(!logits.empty(), "no logits to choose from");
  // max_element keeps the first of equal elements: ties go to the lowest id.
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& o, uint64_t draw) {
  check_sampling_options(o);
  for (size_t i = 0; i < logits.size(); ++i)
    if (!std::isfinite(logits[i]))
      ST_BAD_INPUT("the model's logit for token ", i, " is ", logits[i],
                   ": the weights hold a NaN or an infinity, or the compute type overflowed");
  const auto V = static_cast<int64_t>(logits.size());
  if (o.temperature == 0.0 || o.top_k == 1) return argmax_token(logits);
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  if (o.top_k > 0 && o.top_k < V) {
    const auto k = static_cast<ptrdiff_t>(o.top_k);
    std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
      return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)] ||
             (logits[static_cast<size_t>(a)] == logits[static_cast<size_t>(b)] && a < b);
    });
    ids.resize(static_cast<size_t>(k));
    std::sort(ids.begin(), ids.end());
  }
  double mx = -INFINITY;
  for (int32_t id : ids) mx = std::max(mx, static_cast<double>(logits[static_cast<size_t>(id)]));
  std::vector<double> p(ids.size());
  double total = 0;
  for (size_t i = 0; i < ids.size(); ++i)
    total += (p[i] = std::exp((static_cast<double>(logits[static_cast<size_t>(ids[i])]) - mx) / o.temperature));
  // Inverse CDF: the first candidate at which the running sum reaches u * total (the last one if rounding leaves
  // the sum short of it).
  double u = uniform_at(o.seed, kSampleStream, draw) * total;
  for (size_t i = 0; i < ids.size(); ++i) {
    u -= p[i];
    if (u <= 0) return ids[i];
  }
  return ids.back();
}

}  // namespace st
