// The public side of the configuration: loading (parse, then validate) and the derived values of a Config. The key
// table is config_keys.cc, INI parsing config_ini.cc, the cross-key checks config_validate.cc, and the help texts
// config_help.cc.
#include "shardtrain/core/config.h"

#include <filesystem>
#include <iterator>

#include "config_ini.h"
#include "config_keys.h"
#include "config_validate.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "shardtrain/core/hf_config.h"

namespace st {

int64_t dtype_bytes(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kAuto:
      break;
  }
  ST_CHECK(false, "dtype_bytes of an unresolved dtype (auto)");
  return 0;
}

DType Config::compute_dtype() const {
  if (train.dtype != DType::kAuto) return train.dtype;
  return train.device == Device::kCuda ? DType::kBF16 : DType::kF32;
}

int64_t Config::grad_accum_steps(int world_size) const {
  if (world_size <= 0) ST_BAD_INPUT("world size (", world_size, ") must be > 0");
  const int64_t per_micro_step = train.micro_batch * world_size;
  if (train.global_batch <= 0 || train.micro_batch <= 0 || train.global_batch % per_micro_step != 0) {
    ST_BAD_INPUT("train.global_batch (", train.global_batch, ") must be a multiple of train.micro_batch (",
                 train.micro_batch, ") x world size (", world_size, ") = ", per_micro_step,
                 (source.empty() ? std::string() : " (config " + source + ")"));
  }
  return train.global_batch / per_micro_step;
}

namespace {

// init.from names a Hugging Face model directory: the model keys come from its config.json. A key set explicitly to
// another value is refused rather than silently overridden in either direction.
void apply_hf_model(Config& cfg, const config_internal::ExplicitKeys& set) {
  const std::filesystem::path dir(cfg.init.from);
  const std::string json_path = (dir / "config.json").string();
  if (!std::filesystem::is_regular_file(json_path))
    ST_BAD_INPUT("init.from ", excerpt(cfg.init.from, kExcerptPathChars),
                 " is a directory without config.json (expected a Hugging Face model directory)");
  const HfModelConfig hf = read_hf_config(json_path);
  Config from_hf = cfg;
  from_hf.model = hf.model;
  for (const std::string& name : hf.keys) {
    const config_internal::Key* k = config_internal::find_key(name);
    ST_CHECK(k != nullptr, "no config key ", name);
    const auto it = set.find(name);
    const std::string ours = k->field->format(cfg), theirs = k->field->format(from_hf);
    if (it != set.end() && ours != theirs)
      ST_BAD_INPUT(name, " = ", ours, " in ", it->second, ", ", theirs, " in ", json_path,
                   " (init.from takes the model from config.json: leave the key out or set it to config.json's value)");
    k->field->copy(from_hf, cfg);
  }
  if (hf.max_position_embeddings > 0 && cfg.model.seq_len > hf.max_position_embeddings)
    ST_BAD_INPUT("model.seq_len = ", cfg.model.seq_len, " exceeds max_position_embeddings = ",
                 hf.max_position_embeddings, " in ", json_path);
}

// Parses an optional INI text (labelled for errors), then the overrides, then (with `hf_model`) the model of an
// init.from directory, then validates.
Config load(const std::optional<std::string>& text, const std::string& label, const std::string& source,
            const std::vector<std::string>& overrides, bool hf_model, ConfigFileRole role = ConfigFileRole::kChosen) {
  Config cfg;
  cfg.source = source;
  config_internal::ExplicitKeys set = config_internal::parse_into(cfg, text, label, source, overrides);
  if (role == ConfigFileRole::kDefaults)
    for (auto it = set.begin(); it != set.end();) it = it->second == source ? set.erase(it) : std::next(it);
  if (hf_model && !cfg.init.from.empty() && std::filesystem::is_directory(cfg.init.from)) apply_hf_model(cfg, set);
  const auto problems = config_internal::find_problems(cfg);
  if (!problems.empty()) {
    std::string joined;
    for (const auto& p : problems) joined += (joined.empty() ? "" : "; ") + p;
    ST_BAD_INPUT("config ", cfg.source, (overrides.empty() ? "" : " with command-line overrides"), ": ", joined);
  }
  return cfg;
}

}  // namespace

Config load_config(const std::optional<std::string>& path, const std::vector<std::string>& overrides,
                   ConfigFileRole role) {
  if (!path) return load(std::nullopt, "", "<defaults>", overrides, /*hf_model=*/true);
  const std::string shown = excerpt(*path, kExcerptPathChars);
  return load(config_internal::read_config_file(*path), "config file " + shown, shown, overrides, /*hf_model=*/true,
              role);
}

Config load_config_text(const std::string& ini_text, const std::string& label,
                        const std::vector<std::string>& overrides) {
  // A saved config holds every key already; its init.from directory need not exist any more.
  return load(ini_text, label, label, overrides, /*hf_model=*/false);
}

}  // namespace st
