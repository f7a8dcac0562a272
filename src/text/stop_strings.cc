#include "shardtrain/text/stop_strings.h"

#include <algorithm>
#include <utility>

#include "shardtrain/core/error.h"

namespace st {

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_) ST_CHECK(!s.empty(), "an empty stop string");
}

std::string StopStrings::push(std::string_view piece) {
  if (stopped_) return {};
  held_.append(piece);
  // The first occurrence of any stop string in what is held: nothing released can start one (see below), so it is
  // the first in the whole text.
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, first);
    held_.clear();
    return out;
  }
  // Hold the longest end of the text that is a proper prefix of a stop string: a stop string can start there and
  // nowhere before.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k)
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStrings::finish() { return std::exchange(held_, std::string()); }

}  // namespace st
