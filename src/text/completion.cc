#include "shardtrain/text/completion.h"

#include <algorithm>
#include <utility>

#include "shardtrain/core/error.h"

namespace st {

Completion::Completion(std::unique_ptr<TextStream> text, std::vector<int32_t> end_tokens,
                       std::vector<std::string> stops)
    : stream_(std::move(text)), end_tokens_(std::move(end_tokens)), stops_(stops) {
  ST_CHECK(stream_ != nullptr || stops.empty(), "stop strings need the text: a completion of ids only has none");
}

std::string Completion::close(FinishReason reason) {
  std::string out;
  if (stream_) {
    out = stops_.push(stream_->finish());
    if (!stops_.stopped()) out += stops_.finish();
  }
  reason_ = stops_.stopped() ? FinishReason::kStop : reason;
  text_ += out;
  return out;
}

std::string Completion::push(int32_t token) {
  ST_CHECK(!finished(), "a token after the end of a completion (", to_string(reason_), ")");
  ids_.push_back(token);
  if (std::find(end_tokens_.begin(), end_tokens_.end(), token) != end_tokens_.end()) return close(FinishReason::kStop);
  if (!stream_) return {};
  std::string out = stops_.push(stream_->push(token));
  if (stops_.stopped()) reason_ = FinishReason::kStop;
  text_ += out;
  return out;
}

std::string Completion::finish() { return finished() ? std::string() : close(FinishReason::kLength); }

}  // namespace st
