// Signal-to-noise ratio of x against ref in dB, 20 log10(||ref|| / ||ref - x||): how torchao's FP8 tests judge a
// low-precision result against a high-precision one.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace st::testing {

inline double snr_db(const std::vector<float>& ref, const std::vector<float>& x) {
  double s = 0, e = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    s += static_cast<double>(ref[i]) * ref[i];
    e += (static_cast<double>(ref[i]) - x[i]) * (static_cast<double>(ref[i]) - x[i]);
  }
  return 10 * std::log10(s / std::max(e, 1e-300));
}

}  // namespace st::testing
