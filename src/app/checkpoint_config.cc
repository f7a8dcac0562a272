#include "checkpoint_config.h"

#include <filesystem>

#include "shardtrain/ckpt/checkpoint_check.h"
#include "shardtrain/ckpt/manifest.h"

st::Config checkpoint_config(const std::string& dir, const std::vector<std::string>& overrides) {
  const std::string manifest_path = (std::filesystem::path(dir) / "manifest.json").string();
  // The checks of every checkpoint reader, before anything is built; load_checkpoint checks the rank files.
  const st::Manifest m = st::open_checkpoint(dir);
  const st::Config cfg = st::load_config_text(m.config_ini, "the config saved in " + manifest_path, overrides);
  st::check_model_matches(m, cfg.model, "command-line overrides of " + manifest_path);
  return cfg;
}
