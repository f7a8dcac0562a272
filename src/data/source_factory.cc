#include "shardtrain/data/source_factory.h"

#include "shardtrain/core/error.h"
#include "shardtrain/data/fortunes.h"
#include "shardtrain/data/llmc_source.h"
#include "shardtrain/data/text_source.h"

namespace st {

std::unique_ptr<TokenSource> open_token_source(const std::string& path, DataFormat format, int vocab_size,
                                               const std::string& key, LossMaskMode loss_mask) {
  if (path == kFortunesPath) {
    if (format != DataFormat::kText) {
      ST_BAD_INPUT(key, "=", kFortunesPath, " is a text corpus: it needs data.format=text, not llmc");
    }
    return open_fortunes_source(vocab_size);
  }
  switch (format) {
    case DataFormat::kLlmc:
      return open_llmc_source(path, vocab_size, key, loss_mask);
    case DataFormat::kText:
      return open_text_source(path, vocab_size, key);
  }
  ST_CHECK(false, "unknown DataFormat ", static_cast<int>(format));
}

}  // namespace st
