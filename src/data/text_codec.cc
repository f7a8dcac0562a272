#include "shardtrain/data/text_codec.h"

#include <cstdio>

#include "shardtrain/core/error.h"
#include "shardtrain/data/text_source.h"

namespace st {

std::vector<int32_t> ByteCodec::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
  return ids;
}

std::string ByteCodec::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t t : ids) {
    ST_CHECK(t >= 0 && t < kByteVocab, "token ", t, " is not a byte");
    if (t == '\n' || t == '\t' || (t >= 32 && t < 127)) {
      out.push_back(static_cast<char>(t));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", t);
      out += buf;
    }
  }
  return out;
}

namespace {

class ByteStream final : public TextStream {
 public:
  std::string push(int32_t id) override { return codec_.decode({id}); }
  std::string finish() override { return {}; }

 private:
  ByteCodec codec_;
};

}  // namespace

std::unique_ptr<TextStream> ByteCodec::stream() const { return std::make_unique<ByteStream>(); }

std::unique_ptr<TextCodec> text_codec(int vocab_size) {
  if (vocab_size == kByteVocab) return std::make_unique<ByteCodec>();
  return nullptr;
}

}  // namespace st
