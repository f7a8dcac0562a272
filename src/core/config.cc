// The public side of the configuration: loading (parse, then validate) and the derived values of a Config. The key
// table is config_keys.cc, INI parsing config_ini.cc, the cross-key checks config_validate.cc, and the help texts
// config_help.cc.
#include "shardtrain/core/config.h"

#include "config_ini.h"
#include "config_validate.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"

namespace st {

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

// Parses an optional INI text (labelled for errors), then the overrides, then validates.
Config load(const std::optional<std::string>& text, const std::string& label, const std::string& source,
            const std::vector<std::string>& overrides) {
  Config cfg;
  cfg.source = source;
  config_internal::parse_into(cfg, text, label, overrides);
  const auto problems = config_internal::find_problems(cfg);
  if (!problems.empty()) {
    std::string joined;
    for (const auto& p : problems) joined += (joined.empty() ? "" : "; ") + p;
    ST_BAD_INPUT("config ", cfg.source, (overrides.empty() ? "" : " with command-line overrides"), ": ", joined);
  }
  return cfg;
}

}  // namespace

Config load_config(const std::optional<std::string>& path, const std::vector<std::string>& overrides) {
  if (!path) return load(std::nullopt, "", "<defaults>", overrides);
  const std::string shown = excerpt(*path, kExcerptPathChars);
  return load(config_internal::read_config_file(*path), "config file " + shown, shown, overrides);
}

Config load_config_text(const std::string& ini_text, const std::string& label,
                        const std::vector<std::string>& overrides) {
  return load(ini_text, label, label, overrides);
}

}  // namespace st
