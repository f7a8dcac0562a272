// Expanding `data.path` / `data.val_path`: a single file or a glob(3) pattern such as
// "data/fineweb_train_*.bin".
//
//   std::vector<std::string> files = st::expand_data_path("shards/train_*.bin");  // sorted, >= 1 entry
#pragma once

#include <string>
#include <vector>

namespace st {

// The files that `pattern` names, sorted bytewise (independent of the locale), with no duplicates.
// A pattern without glob metacharacters names one file. Throws kBadInput naming the pattern when nothing
// matches (or, for a plain path, naming the missing file), and naming the path of any match that is not a
// regular file (e.g. a directory). `what` prefixes the messages, e.g. "data.path".
std::vector<std::string> expand_data_path(const std::string& pattern, const std::string& what = "data.path");

}  // namespace st
