#include "shardtrain/train/progress_bar.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace st {
namespace {

std::string format_rate(double tokens_per_s) {
  char buf[32];
  if (!std::isfinite(tokens_per_s))
    std::snprintf(buf, sizeof(buf), "-");
  else if (tokens_per_s < 1e4)
    std::snprintf(buf, sizeof(buf), "%.0f", tokens_per_s);
  else if (tokens_per_s < 1e7)
    std::snprintf(buf, sizeof(buf), "%.1fk", tokens_per_s / 1e3);
  else
    std::snprintf(buf, sizeof(buf), "%.2fM", tokens_per_s / 1e6);
  return buf;
}

}  // namespace

std::string format_duration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds) + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600), static_cast<long long>(s / 60 % 60));
  else
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

std::string progress_bar_text(const ProgressState& s) {
  constexpr int kWidth = 30;
  const double frac =
      s.total > 0 ? std::clamp(static_cast<double>(s.step) / static_cast<double>(s.total), 0.0, 1.0) : 0.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string text = "[" + std::string(static_cast<size_t>(filled), '#') +
                     std::string(static_cast<size_t>(kWidth - filled), '.') + "] ";
  char buf[160];
  const std::string eta =
      s.steps_done > 0 ? format_duration(s.elapsed_s / static_cast<double>(s.steps_done) *
                                         static_cast<double>(std::max<int64_t>(0, s.total - s.step)))
                       : std::string("--");
  std::snprintf(buf, sizeof(buf), "%lld/%lld | ETA %s | %s tok/s | loss %.4f", static_cast<long long>(s.step),
                static_cast<long long>(s.total), eta.c_str(), format_rate(s.tokens_per_s).c_str(), s.loss);
  return text + buf;
}

}  // namespace st
