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

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  // Text for printing. Ids outside the codec's vocabulary are kInternal: the model samples from its own.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
};

// The byte codec: each byte is its own id (encode), and decode prints text as is (printable ASCII, newline, tab) and
// every other byte as \xNN, so that a terminal shows exactly which bytes came out.
class ByteCodec final : public TextCodec {
 public:
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
};

// The codec for a model's vocabulary: ByteCodec for vocab_size 256, null for any other (text needs a tokenizer).
std::unique_ptr<TextCodec> text_codec(int vocab_size);

}  // namespace st
