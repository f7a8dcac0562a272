// Text to ids and back through a tokenizer.json (tokenizer.h), for `shardtrain generate` and the trainer's end-of-run
// sample: the TextCodec (data/text_codec.h) of models whose vocabulary is not bytes.
//
// A prompt is read as a new document: the tokenizer family's document separator first (conventions.h: Llama 3's
// <|begin_of_text|>, GPT-2's and Qwen's <|endoftext|>, as `shardtrain tokenize` writes documents), unless the text
// already starts with it, then the text with its added tokens recognised (writing "<|im_start|>" in a prompt gives
// that token). Decoding gives the tokens' text, added tokens as their content. A model's vocabulary may have rows past
// the tokenizer's ids (Qwen2.5's 151,936 for 151,665 tokens, or a vocabulary padded for the GPU): a sampled id there
// decodes to nothing, as Hugging Face's decode skips an id its tokenizer lacks.
//
//   std::unique_ptr<st::TextCodec> c = st::make_text_codec(cfg.data.tokenizer, cfg.model.vocab_size, "data.tokenizer");
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "shardtrain/data/text_codec.h"
#include "shardtrain/text/tokenizer.h"

namespace st {

class TokenizerCodec final : public TextCodec {
 public:
  explicit TokenizerCodec(Tokenizer tok);
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  // Holds the bytes of an unfinished UTF-8 character until a later token completes it. The stream refers to this
  // codec's tokenizer: it must not outlive the codec.
  std::unique_ptr<TextStream> stream() const override;
  const Tokenizer& tokenizer() const { return tok_; }

 private:
  Tokenizer tok_;
  int32_t separator_ = -1;
};

// With `tokenizer_path` set: a TokenizerCodec, whose vocabulary must fit the model's (kBadInput naming `what`, the file
// and both sizes otherwise). Without: text_codec(vocab_size) (bytes for a byte-level model, else null).
std::unique_ptr<TextCodec> make_text_codec(const std::string& tokenizer_path, int vocab_size, const std::string& what);

}  // namespace st
