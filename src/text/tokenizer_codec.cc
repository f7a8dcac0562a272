#include "shardtrain/text/tokenizer_codec.h"

#include "shardtrain/core/error.h"
#include "shardtrain/text/conventions.h"
#include "utf8.h"

namespace st {

TokenizerCodec::TokenizerCodec(Tokenizer tok) : tok_(std::move(tok)) {
  // A tokenizer without a separator shardtrain knows reads prompts as they are.
  const bool known = tok_.token_id("<|begin_of_text|>").has_value() || tok_.token_id("<|endoftext|>").has_value();
  separator_ = known ? Conventions(tok_, "").separator() : -1;
}

std::vector<int32_t> TokenizerCodec::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  const std::vector<int32_t> body = tok_.encode(text, /*added_tokens=*/true);
  if (separator_ >= 0 && (body.empty() || body.front() != separator_)) ids.push_back(separator_);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

std::string TokenizerCodec::decode(const std::vector<int32_t>& ids) const {
  std::vector<int32_t> known;
  known.reserve(ids.size());
  for (const int32_t id : ids)
    if (id >= 0 && id < tok_.vocab_size()) known.push_back(id);
  return tok_.decode(known);
}

namespace {

class TokenizerStream final : public TextStream {
 public:
  explicit TokenizerStream(const Tokenizer& tok) : tok_(tok) {}

  std::string push(int32_t id) override {
    if (id < 0 || id >= tok_.vocab_size()) return "";  // a row of the model's the tokenizer lacks
    pending_.append(tok_.token_bytes(id));
    const size_t ready = pending_.size() - text::utf8_unfinished_tail(pending_);
    std::string piece = lossy(std::string_view(pending_).substr(0, ready));
    pending_.erase(0, ready);
    return piece;
  }

  std::string finish() override {
    std::string rest = lossy(pending_);
    pending_.clear();
    return rest;
  }

 private:
  static std::string lossy(std::string_view bytes) {
    std::string buf;
    return std::string(text::utf8_lossy(bytes, &buf));
  }

  const Tokenizer& tok_;
  std::string pending_;  // at most 3 bytes: an unfinished character
};

}  // namespace

std::unique_ptr<TextStream> TokenizerCodec::stream() const { return std::make_unique<TokenizerStream>(tok_); }

std::unique_ptr<TextCodec> make_text_codec(const std::string& tokenizer_path, int vocab_size, const std::string& what) {
  if (tokenizer_path.empty()) return text_codec(vocab_size);
  Tokenizer tok = Tokenizer::load(tokenizer_path);
  if (tok.vocab_size() > vocab_size)
    ST_BAD_INPUT(what, " = ", tokenizer_path, " has ", tok.vocab_size(), " token ids, more than the model's vocabulary of ",
                 vocab_size, " (model.vocab_size): the tokenizer belongs to another model");
  return std::make_unique<TokenizerCodec>(std::move(tok));
}

}  // namespace st
