#include "shardtrain/data/fortunes.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>

#include "shardtrain/core/env.h"
#include "shardtrain/core/error.h"
#include "shardtrain/data/text_source.h"

namespace st {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_index_or_alias(const std::string& name) { return ends_with(name, ".dat") || ends_with(name, ".u8"); }

[[noreturn]] void no_corpus(const std::string& dir, const std::string& why) {
  ST_BAD_INPUT("data.path=", kFortunesPath, " reads the text files of the Debian package `fortunes` from ", dir,
               " (SHARDTRAIN_FORTUNES_DIR), but ", why,
               ". Install it with `apt-get install fortunes`, point SHARDTRAIN_FORTUNES_DIR at a directory of "
               "fortune files, or set data.path to your own data");
}

}  // namespace

std::vector<std::string> fortunes_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) no_corpus(dir, "that directory does not exist");

  std::vector<fs::path> entries;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) entries.push_back(it->path());
  if (ec) no_corpus(dir, "that directory cannot be read: " + ec.message());
  std::sort(entries.begin(), entries.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });

  std::vector<std::string> files;
  std::set<fs::path> taken;  // resolved paths, so two names for one file count once
  for (const fs::path& p : entries) {
    if (is_index_or_alias(p.filename().string())) continue;
    std::error_code e;
    if (!fs::is_regular_file(p, e)) continue;  // follows symlinks: drops directories and dangling links
    const fs::path target = fs::canonical(p, e);
    if (e) continue;
    if (is_index_or_alias(target.filename().string())) continue;
    if (fs::file_size(target, e) == 0 || e) continue;
    if (!taken.insert(target).second) continue;
    files.push_back(p.string());
  }
  if (files.empty()) no_corpus(dir, "it holds no fortune text files (only *.dat / *.u8, or nothing)");
  return files;
}

std::unique_ptr<FileTokenSource> open_fortunes_source(int vocab_size) {
  const std::string dir = env_get("SHARDTRAIN_FORTUNES_DIR");
  return open_text_files(fortunes_files(dir), vocab_size, str_cat("built-in corpus ", kFortunesPath, " from ", dir));
}

}  // namespace st
