#include "shardtrain/core/cuda_timer.h"

#include <algorithm>
#include <cstdio>

namespace st {

void OpTimer::mark(const char* name, cudaStream_t s) {
  if (used_ == marks_.size()) marks_.push_back(std::make_unique<Mark>());
  Mark& m = *marks_[used_++];
  m.name = name;
  m.event.record(s);
}

void OpTimer::collect_first(size_t n) {
  n = std::min(n, used_);
  for (size_t i = 0; i + 1 < n; ++i) {
    if (marks_[i]->name == nullptr) continue;
    marks_[i + 1]->event.synchronize();  // at once where the stream has passed it
    float ms = 0;
    ST_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[i]->event.get(), marks_[i + 1]->event.get()));
    auto& t = totals_[marks_[i]->name];
    t.first += ms;
    ++t.second;
  }
  // The marks after the first n move to the front, to be collected later; the collected ones are reused.
  std::rotate(marks_.begin(), marks_.begin() + static_cast<std::ptrdiff_t>(n),
              marks_.begin() + static_cast<std::ptrdiff_t>(used_));
  used_ -= n;
}

std::string OpTimer::report(int64_t steps) const {
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  double total = 0;
  for (const auto& r : rows) total += r.second.first;
  const double per = steps > 0 ? static_cast<double>(steps) : 1.0;
  std::string out =
      "op profile (GPU time per training step after the first, evaluations left out; compute stream, and optim.adamw "
      "on the optimizer stream beside it; SHARDTRAIN_PROFILE_OPS=1):\n";
  char line[160];
  for (const auto& r : rows) {
    std::snprintf(line, sizeof(line), "  %-24s %9.3f ms  %5.1f%%  %6.1f calls\n", r.first.c_str(), r.second.first / per,
                  total > 0 ? 100.0 * r.second.first / total : 0.0, r.second.second / per);
    out += line;
  }
  std::snprintf(line, sizeof(line), "  %-24s %9.3f ms\n", "total", total / per);
  return out + line;
}

}  // namespace st
