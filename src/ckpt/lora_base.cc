#include "shardtrain/ckpt/lora_base.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/hf_dir.h"
#include "shardtrain/core/error.h"

namespace st {

namespace fs = std::filesystem;

ManifestBase describe_lora_base(const std::string& init_from) {
  ManifestBase b;
  b.init_from = init_from;
  if (init_from.empty()) return b;
  std::vector<std::string> names;  // relative to `root`
  fs::path root;
  if (fs::is_directory(init_from)) {
    root = init_from;
    const HfDirWeights weights(init_from);
    std::set<std::string> files;
    for (const std::string& t : weights.names()) files.insert(weights.file_of(t));
    names.push_back("config.json");
    if (fs::exists(root / "model.safetensors.index.json")) names.push_back("model.safetensors.index.json");
    names.insert(names.end(), files.begin(), files.end());
  } else {
    root = fs::path(init_from).parent_path();
    names.push_back(fs::path(init_from).filename().string());
  }
  std::sort(names.begin(), names.end());
  for (const std::string& n : names) {
    const std::string path = (root / n).string();
    if (!fs::is_regular_file(path)) ST_BAD_INPUT("the LoRA base init.from ", init_from, ": ", path, " is not a file");
    b.files.push_back(ManifestBaseFile{n, sha256_file(path)});
  }
  return b;
}

void check_lora_base(const ManifestBase& recorded, const ManifestBase& now, const std::string& where) {
  if (recorded.init_from.empty() != now.init_from.empty())
    ST_BAD_INPUT(
        where, ": the adapters were trained on ",
        recorded.init_from.empty() ? std::string("the seed's random base") : "init.from " + recorded.init_from,
        ", and this run's base is ",
        now.init_from.empty() ? std::string("the seed's random base (no init.from)") : "init.from " + now.init_from);
  for (const ManifestBaseFile& r : recorded.files) {
    const auto it =
        std::find_if(now.files.begin(), now.files.end(), [&](const ManifestBaseFile& f) { return f.name == r.name; });
    if (it == now.files.end())
      ST_BAD_INPUT(where, ": the base the adapters were trained on had ", r.name, ", which init.from ", now.init_from,
                   " does not have");
    if (it->sha256 != r.sha256)
      ST_BAD_INPUT(where, ": the base file ", r.name, " in init.from ", now.init_from,
                   " changed since the adapters were ", "trained on it: sha256 ", it->sha256,
                   ", the checkpoint recorded ", r.sha256);
  }
  for (const ManifestBaseFile& f : now.files)
    if (std::none_of(recorded.files.begin(), recorded.files.end(),
                     [&](const ManifestBaseFile& r) { return r.name == f.name; }))
      ST_BAD_INPUT(where, ": init.from ", now.init_from, " has ", f.name,
                   ", which the base the adapters were trained on did not have");
}

ManifestBase check_base_of_checkpoint(const Manifest& m, const std::string& init_from, uint64_t seed,
                                      const std::string& where) {
  ManifestBase now = describe_lora_base(init_from);
  check_lora_base(m.base, now, where);
  if (init_from.empty() && m.seed != seed)
    ST_BAD_INPUT(where, ": the adapters were trained on the random base of train.seed ", m.seed,
                 ", and this run's is train.seed ", seed);
  return now;
}

std::string lora_base_read_text(const Manifest& m, const std::string& init_from, uint64_t seed) {
  return str_cat("LoRA base ", init_from.empty() ? str_cat("drawn from train.seed ", seed) : "read from " + init_from,
                 " (", m.base.files.size(), " file(s), each as the checkpoint recorded it)");
}

std::string lora_base_to_merge(const Manifest& m, const std::string& step_dir) {
  const std::string where = (fs::path(step_dir) / "manifest.json").string();
  if (m.base.init_from.empty())
    ST_BAD_INPUT(where, ": the adapters were trained on the random base of train.seed ", m.seed,
                 ", which has no file to merge them into: export the adapters (--adapter) instead");
  check_lora_base(m.base, describe_lora_base(m.base.init_from), where);
  return m.base.init_from;
}

}  // namespace st
