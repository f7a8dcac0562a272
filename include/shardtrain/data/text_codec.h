// How text becomes token ids, and generated ids become text: the prompt and output of `shardtrain generate` and the
// trainer's end-of-run sample. A model whose vocabulary is bytes (vocab_size 256, as text data trains it) reads text
// one byte a token; any other vocabulary needs a tokenizer.
//
//   std::unique_ptr<TextCodec> codec = text_codec(cfg.model.vocab_size);   // null: no codec for this vocabulary
//   std::vector<int32_t> ids = codec->encode("Once upon a time");
//   std::string text = codec->decode(ids);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace st {

// Text decoded a token at a time, to print tokens as they come: the pieces push() returns, then finish()'s,
// concatenate to decode() of every id pushed. A piece never ends inside a UTF-8 character: the bytes of a character
// that a token leaves unfinished (a byte-level BPE token can end mid-character) are held until a later token completes
// it, or until finish() returns them (replaced as decode() would replace them).
class TextStream {
 public:
  virtual ~TextStream() = default;
  virtual std::string push(int32_t id) = 0;
  virtual std::string finish() = 0;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // Text for printing. Ids outside the codec's vocabulary are kInternal: the model samples from its own.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // A new stream of decode()'s text, token by token; it keeps no reference to the ids pushed.
  virtual std::unique_ptr<TextStream> stream() const = 0;
};

// The byte codec: each byte is its own id (encode), and decode prints text as is (printable ASCII, newline, tab) and
// every other byte as \xNN, so that a terminal shows exactly which bytes came out.
class ByteCodec final : public TextCodec {
 public:
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::unique_ptr<TextStream> stream() const override;  // each token's text at once: a byte is a whole character
};

// The codec for a model's vocabulary: ByteCodec for vocab_size 256, null for any other (text needs a tokenizer).
std::unique_ptr<TextCodec> text_codec(int vocab_size);

}  // namespace st
