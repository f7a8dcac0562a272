// The exports of a LoRA checkpoint: PEFT's adapter directory, and the values of the merged model.
#include "shardtrain/ckpt/lora_export.h"

#include <nlohmann/json.hpp>

#include "export_parts.h"
#include "shardtrain/ckpt/checkpoint_check.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/lora_base.h"
#include "shardtrain/ckpt/safetensors.h"
#include "shardtrain/core/error.h"
#include "shardtrain/model/lora.h"

namespace st {
namespace ckpt_internal {

LlamaExportValues::LlamaExportValues(const std::string& step_dir, const Manifest& m,
                                     const std::vector<UnitLayout>& units)
    : m_(m), units_(units), gather_(step_dir, m) {
  if (!m.model.lora.enabled()) return;
  const std::string where = step_dir + "/manifest.json";
  if (m.base.init_from.empty())
    ST_BAD_INPUT(where, ": the adapters were trained on the random base of train.seed ", m.seed,
                 ", which has no files to merge them into: export the adapters (--adapter) instead");
  check_lora_base(m.base, describe_lora_base(m.base.init_from), where);
  base_ = std::make_unique<HfDirWeights>(m.base.init_from);
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

}  // namespace st
