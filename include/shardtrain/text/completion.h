// One generated sequence as `shardtrain generate` reports it: its token ids, and its text decoded a token at a time
// (a TextStream), which ends at an end token (a chat's end of turn, not part of the text) or just before a stop string
// (StopStrings: the text that could still start one is held back), and why it ended.
//
//   Completion c(codec->stream(), conv.chat_end_tokens(), {"\n\n"});
//   for (int64_t i = 0; i < n && !c.finished(); ++i) print(c.push(next_token()));
//   print(c.finish());   // a sequence that used its n tokens: finish_reason() kLength, else kStop
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/core/enum_names.h"
#include "shardtrain/data/text_codec.h"
#include "shardtrain/text/stop_strings.h"

namespace st {

enum class FinishReason {
  kNone,    // still going
  kLength,  // it used every token it was given
  kStop,    // an end token or a stop string ended it
};
// to_string: "length" and "stop", the names of OpenAI's and vLLM's finish_reason; "none" while it goes on.
template <>
struct EnumNames<FinishReason> {
  static constexpr EnumName<FinishReason> kList[] = {
      {FinishReason::kNone, "none"}, {FinishReason::kLength, "length"}, {FinishReason::kStop, "stop"}};
};

class Completion {
 public:
  // `text`: the stream of the prompt's codec, or null for ids only (no text; `stops` must then be empty).
  // `end_tokens`: ids that end the sequence (the token is kept in ids(), its text is not printed).
  Completion(std::unique_ptr<TextStream> text, std::vector<int32_t> end_tokens, std::vector<std::string> stops);

  // The next token. Returns the text it makes printable ("" without a text stream), which text() now ends with.
  // An end token, or a token that completes a stop string, finishes the sequence (kStop). Not after finished().
  std::string push(int32_t token);
  // Ends a sequence that used its tokens (kLength; a stop string found in the text held back makes it kStop):
  // returns the text held back. "" and nothing changes once finished().
  std::string finish();

  bool finished() const { return reason_ != FinishReason::kNone; }
  FinishReason finish_reason() const { return reason_; }
  const std::vector<int32_t>& ids() const { return ids_; }  // every token pushed, an end token included
  const std::string& text() const { return text_; }         // the text printable so far
  bool has_text() const { return stream_ != nullptr; }

 private:
  // The stream's held bytes and the stop strings' held text, ending the text with `reason`.
  std::string close(FinishReason reason);

  std::unique_ptr<TextStream> stream_;
  std::vector<int32_t> end_tokens_;
  StopStrings stops_;
  std::vector<int32_t> ids_;
  std::string text_;
  FinishReason reason_ = FinishReason::kNone;
};

}  // namespace st
