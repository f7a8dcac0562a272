// The exports of a LoRA checkpoint: PEFT's adapter directory, and the values of the merged model.
#include "shardtrain/ckpt/peft_adapter.h"

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "export_parts.h"
#include "shardtrain/ckpt/checkpoint_check.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/lora_base.h"
#include "shardtrain/ckpt/safetensors.h"
#include "shardtrain/ckpt/safetensors_reader.h"
#include "shardtrain/comm/on_all_ranks.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/lora.h"

namespace st {
namespace ckpt_internal {

LlamaExportValues::LlamaExportValues(const std::string& step_dir, const Manifest& m,
                                     const std::vector<UnitLayout>& units)
    : m_(m), units_(units), gather_(step_dir, m) {
  if (!m.model.lora.enabled()) return;
  base_ = std::make_unique<HfDirWeights>(lora_base_to_merge(m, step_dir));
}

void LlamaExportValues::read(const HfRange& r, float* out) {
  const UnitLayout& u = units_[static_cast<size_t>(r.unit)];
  if (!base_) return gather_.read(u, ShardSpan{r.offset, r.numel}, out);
  base_->read_range(r.hf_name, 0, r.numel, out);
  // The range is rows [row0, row0 + rows) of one weight (q_proj of attn.qkv.weight, ...): the adapters of that
  // weight whose rows lie there add to them.
  const TensorSpec* w = nullptr;
  for (const TensorSpec& t : u.tensors)
    if (t.offset <= r.offset && r.offset < t.offset + t.numel) w = &t;
  ST_CHECK(w != nullptr, "no tensor of ", u.name, " holds ", r.hf_name);
  const int64_t width = w->shape.size() == 2 ? w->shape[1] : 1;
  const int64_t row0 = (r.offset - w->offset) / width, rows = r.numel / width;
  for (const LoraAdapter& a : lora_adapters(u, m_.model)) {
    if (a.linear.weight != w->name || a.linear.row0 < row0 || a.linear.row0 + a.linear.rows > row0 + rows) continue;
    a_.resize(static_cast<size_t>(a.rank * a.linear.in));
    b_.resize(static_cast<size_t>(a.linear.rows * a.rank));
    gather_.read(u, ShardSpan{a.a_offset, static_cast<int64_t>(a_.size())}, a_.data());
    gather_.read(u, ShardSpan{a.b_offset, static_cast<int64_t>(b_.size())}, b_.data());
    add_lora_delta(out + (a.linear.row0 - row0) * width, a_.data(), b_.data(), a.linear.rows, a.linear.in, a.rank,
                   lora_scale(m_.model.lora));
  }
}

}  // namespace ckpt_internal

namespace {

// PEFT's name of an adapter matrix: base_model.model.<the module's name in the Hugging Face model>.lora_A.weight.
std::string peft_name(const ModelConfig& model, const UnitLayout& u, const LoraLinear& l, char which) {
  const std::string layer = std::to_string(u.layer);
  const std::string prefix = model.is_llama() ? "base_model.model.model.layers." : "base_model.model.transformer.h.";
  return prefix + layer + "." + l.hf_module + ".lora_" + which + ".weight";
}

}  // namespace

std::string peft_adapter_config_json(const Manifest& m) {
  const LoraConfig& l = m.model.lora;
  const Config run = load_config_text(m.config_ini, "the checkpoint's config_ini", {});
  nlohmann::ordered_json j;
  std::vector<std::string> modules;
  for (const LoraLinear& t : lora_targets(m.model)) modules.push_back(t.hf_module);
  j["alpha_pattern"] = nlohmann::ordered_json::object();
  j["base_model_name_or_path"] = m.base.init_from.empty() ? nullptr : nlohmann::ordered_json(m.base.init_from);
  j["bias"] = "none";
  // GPT-2's linear layers are Conv1D ([in, out] weights): PEFT wraps them with fan_in_fan_out.
  j["fan_in_fan_out"] = !m.model.is_llama();
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["lora_alpha"] = l.alpha;
  j["lora_dropout"] = run.model.lora.dropout;
  j["modules_to_save"] = nullptr;
  j["peft_type"] = "LORA";
  j["r"] = l.rank;
  j["rank_pattern"] = nlohmann::ordered_json::object();
  j["target_modules"] = modules;
  j["task_type"] = "CAUSAL_LM";
  j["use_rslora"] = l.rslora;
  return j.dump(2) + "\n";
}

AdapterExportReport export_peft_adapter(const std::string& step_dir, const std::string& out_dir) {
  const Manifest m = open_checkpoint(step_dir);
  if (!m.model.lora.enabled())
    ST_BAD_INPUT("ckpt export ", step_dir, " --adapter: this checkpoint trained the whole model (no lora.rank in its ",
                 "manifest): export it with --out");
  ckpt_internal::NewDirectory out(out_dir, "ckpt export --adapter");
  const std::vector<UnitLayout> units = build_units(m.model);
  struct Entry {
    std::string name;
    const UnitLayout* unit;
    ShardSpan range;
    std::vector<int64_t> shape;
  };
  std::vector<Entry> entries;
  for (const UnitLayout& u : units)
    for (const LoraAdapter& a : lora_adapters(u, m.model)) {
      entries.push_back({peft_name(m.model, u, a.linear, 'A'),
                         &u,
                         ShardSpan{a.a_offset, a.rank * a.linear.in},
                         {a.rank, a.linear.in}});
      entries.push_back({peft_name(m.model, u, a.linear, 'B'),
                         &u,
                         ShardSpan{a.b_offset, a.linear.rows * a.rank},
                         {a.linear.rows, a.rank}});
    }
  std::vector<SafetensorsTensor> decl;
  for (const Entry& e : entries) decl.push_back({e.name, e.shape});
  AdapterExportReport report;
  report.dir = out.dir();
  report.tensors = static_cast<int>(entries.size());
  ckpt_internal::ParamGather gather(step_dir, m);
  SafetensorsWriter w(out.file("adapter_model.safetensors"), std::move(decl));
  std::vector<float> buf;
  for (const Entry& e : entries) {
    buf.resize(static_cast<size_t>(e.range.count));
    gather.read(*e.unit, e.range, buf.data());
    w.write(e.name, buf.data(), e.range.count);
  }
  w.finish();
  report.bytes = w.file_bytes();
  write_file_atomic(out.file("adapter_config.json"), peft_adapter_config_json(m));
  out.commit();
  return report;
}

namespace {

// adapter_config.json against the run's lora keys: PEFT's LoRA, the same r, lora_alpha, use_rslora, and target modules
// that are exactly the run's adapted modules (each by its full name under a layer or by its last part).
void check_adapter_config(const std::string& path, const ModelConfig& cfg) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::parse_error& e) {
    ST_BAD_INPUT(path, ": not valid JSON at byte ", e.byte);
  }
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.is_object() || !j.contains(key)) ST_BAD_INPUT(path, ": required field ", key, " is missing");
    return j[key];
  };
  const LoraConfig& l = cfg.lora;
  if (field("peft_type") != "LORA")
    ST_BAD_INPUT(path, ": peft_type is ", field("peft_type").dump(), ", expected \"LORA\"");
  if (!field("r").is_number_integer() || field("r").get<int64_t>() != l.rank)
    ST_BAD_INPUT(path, ": r is ", field("r").dump(), ", lora.rank is ", l.rank);
  if (!field("lora_alpha").is_number() || field("lora_alpha").get<double>() != static_cast<double>(l.alpha))
    ST_BAD_INPUT(path, ": lora_alpha is ", field("lora_alpha").dump(), ", lora.alpha is ", l.alpha);
  const bool rslora = j.contains("use_rslora") && j["use_rslora"].is_boolean() && j["use_rslora"].get<bool>();
  if (rslora != l.rslora)
    ST_BAD_INPUT(path, ": use_rslora is ", rslora ? "true" : "false", ", lora.rslora is ", l.rslora ? "true" : "false");
  std::set<std::string> want, got;
  for (const LoraLinear& t : lora_targets(cfg)) want.insert(t.hf_module);
  const std::vector<LoraLinear> all = lora_linears(cfg);
  const nlohmann::json& modules = field("target_modules");
  if (!modules.is_array()) ST_BAD_INPUT(path, ": target_modules is ", modules.dump(), ", expected a list of names");
  for (const nlohmann::json& m : modules) {
    const std::string name = m.is_string() ? m.get<std::string>() : m.dump();
    bool matched = false;
    for (const LoraLinear& t : all) {
      const std::string& full = t.hf_module;
      if (full == name ||
          (full.size() > name.size() && full.compare(full.size() - name.size(), name.size(), name) == 0 &&
           full[full.size() - name.size() - 1] == '.')) {
        got.insert(full);
        matched = true;
      }
    }
    if (!matched)
      ST_BAD_INPUT(path, ": target_modules names ", name, ", which is no linear layer of this model's blocks");
  }
  if (got != want) {
    auto list = [](const std::set<std::string>& s) {
      std::string out;
      for (const std::string& n : s) out += (out.empty() ? "" : ", ") + n;
      return out;
    };
    ST_BAD_INPUT(path, ": target_modules adapt ", list(got), "; lora.targets (", l.targets, ") adapts ", list(want));
  }
}

}  // namespace

void load_peft_adapter(const std::string& dir, const ModelConfig& cfg, ModelBackend& model) {
  namespace fs = std::filesystem;
  ST_CHECK(cfg.lora.enabled(), "load_peft_adapter without LoRA");
  const std::string config = (fs::path(dir) / "adapter_config.json").string();
  const std::string weights = (fs::path(dir) / "adapter_model.safetensors").string();
  check_adapter_config(config, cfg);
  on_all_ranks(
      model.comm(),
      [&] {
        const SafetensorsReader file(weights);
        std::set<std::string> used;
        struct Part {
          std::string name;
          int64_t offset, numel;  // the tensor in the unit's flat buffer
          ShardSpan part;         // what this rank owns of it
        };
        for (const UnitLayout& u : model.units()) {
          std::vector<Part> parts;
          for (const LoraAdapter& a : lora_adapters(u, cfg)) {
            for (const char which : {'A', 'B'}) {
              const std::string name = peft_name(cfg, u, a.linear, which);
              const std::vector<int64_t> shape = which == 'A' ? std::vector<int64_t>{a.rank, a.linear.in}
                                                              : std::vector<int64_t>{a.linear.rows, a.rank};
              if (!file.has(name)) ST_BAD_INPUT(weights, ": no tensor ", name);
              if (file.shape(name) != shape)
                ST_BAD_INPUT(weights, ": ", name, " is ", shape_text(file.shape(name)), ", expected ",
                             shape_text(shape));
              used.insert(name);
              const int64_t offset = which == 'A' ? a.a_offset : a.b_offset, numel = shape[0] * shape[1];
              const ShardSpan part = owned_range(model.shard(u.index), u, offset, numel).part;
              if (part.count > 0) parts.push_back({name, offset, numel, part});
            }
          }
          if (parts.empty()) continue;
          model.pull_unit(u.index);  // one pull and one push a unit
          for (const Part& p : parts) {
            float* out = owned_range(model.shard(u.index), u, p.offset, p.numel).data;
            file.read_range(p.name, p.part.offset - p.offset, p.part.count, out);
            for (int64_t i = 0; i < p.part.count; ++i)
              if (!std::isfinite(out[i])) {
                model.release_unit(u.index);
                ST_BAD_INPUT(weights, ": ", p.name, " element ", p.part.offset - p.offset + i, " is ", out[i]);
              }
          }
          model.push_unit(u.index);
        }
        for (const std::string& n : file.names())
          if (!used.count(n))
            ST_BAD_INPUT(weights, ": ", n, " is no adapter of this model (lora.targets ", cfg.lora.targets, ")");
      },
      "could not load lora.from");
}

}  // namespace st
