#include "shardtrain/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "shardtrain/core/error.h"

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
  if (o.temperature == 0.0 || o.top_k == 1) return argmax_token(logits);
  ST_CHECK(!logits.empty() && logits.size() <= static_cast<size_t>(INT32_MAX), "sampling among ", logits.size(),
           " logits");
  const int V = static_cast<int>(logits.size());
  int32_t token = -1;
  sample_rows(logits.data(), V, 1, V, &draw, o, &token);
  return token;
}

}  // namespace st
