#include "shardtrain/data/text_source.h"

#include <utility>

#include "shardtrain/core/error.h"
#include "shardtrain/core/log.h"
#include "shardtrain/data/path_glob.h"

namespace st {
namespace {

void check_byte_vocab(int vocab_size, const std::string& label) {
  if (vocab_size < kByteVocab) {
    ST_BAD_INPUT("data.format=text reads bytes (256 values), which needs model.vocab_size >= ", kByteVocab, ", got ",
                 vocab_size, " (", label, ")");
  }
}

}  // namespace

std::unique_ptr<FileTokenSource> open_text_files(const std::vector<std::string>& paths, int vocab_size,
                                                 const std::string& label) {
  check_byte_vocab(vocab_size, label);
  ST_CHECK(!paths.empty(), label);
  std::vector<FilePayload> files;
  files.reserve(paths.size());
  int64_t total = 0;
  for (const std::string& p : paths) {
    MappedFile f(p);
    if (f.size() == 0) ST_BAD_INPUT("text data file ", p, " is empty (0 bytes)");
    const int64_t n = f.size();
    files.push_back(FilePayload{std::move(f), 0, n, TokenWidth::kU8});
    total += n;
  }
  std::string description =
      str_cat(label, " (", paths.size(), paths.size() == 1 ? " file, " : " files, ", total, " bytes)");
  ST_LOG_INFO("data: ", description);
  return std::make_unique<FileTokenSource>(std::move(files), kByteVocab, std::move(description));
}

std::unique_ptr<FileTokenSource> open_text_source(const std::string& path, int vocab_size, const std::string& key) {
  const std::string label = str_cat("text '", path, "'");
  // Check the vocabulary before touching the files: that error is about the config, not the data.
  check_byte_vocab(vocab_size, label);
  return open_text_files(expand_data_path(path, key), vocab_size, label);
}

}  // namespace st
