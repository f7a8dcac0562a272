#include "shardtrain/data/path_glob.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>

#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"

namespace st {
namespace {

bool has_glob_metachars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// glob(3) holds a malloc'd result; free it on every path out, including throws.
struct GlobResult {
  glob_t g{};
  ~GlobResult() { globfree(&g); }
};

}  // namespace

std::vector<std::string> expand_data_path(const std::string& pattern, const std::string& what) {
  if (pattern.empty()) ST_BAD_INPUT(what, " is empty: give a file or a glob pattern");
  const std::string shown = excerpt(pattern, kExcerptPathChars);
  GlobResult r;
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &r.g);
  if (rc == GLOB_NOMATCH) {
    if (has_glob_metachars(pattern)) ST_BAD_INPUT(what, " pattern '", shown, "' matches no file");
    ST_BAD_INPUT(what, " file '", shown, "' does not exist");
  }
  if (rc == GLOB_NOSPACE) ST_FAULT("glob('", shown, "') ran out of memory");
  if (rc != 0) ST_BAD_INPUT(what, " pattern '", shown, "': a directory could not be read while expanding it");

  std::vector<std::string> files(r.g.gl_pathv, r.g.gl_pathv + r.g.gl_pathc);
  // glob(3) sorts with strcoll(), which depends on the locale; the data order must not.
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  for (const std::string& f : files) {
    struct stat st {};
    if (::stat(f.c_str(), &st) != 0)
      ST_BAD_INPUT(what, " pattern '", shown, "': cannot stat match '", excerpt(f, kExcerptPathChars), "'");
    if (!S_ISREG(st.st_mode))
      ST_BAD_INPUT(what, " pattern '", shown, "' matches '", excerpt(f, kExcerptPathChars),
                   "', which is not a regular file");
  }
  return files;
}

}  // namespace st
