#include "shardtrain/model/lora.h"

#include <algorithm>
#include <cmath>

#include "shardtrain/core/error.h"
#include "shardtrain/model/family.h"

namespace st {
namespace {

std::string names_of(const std::vector<LoraLinear>& linears) {
  std::string out;
  for (const LoraLinear& l : linears) out += (out.empty() ? "" : ", ") + l.name;
  return out;
}

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

std::string a_name(const LoraLinear& l) { return "lora." + l.name + ".A"; }
std::string b_name(const LoraLinear& l) { return "lora." + l.name + ".B"; }

}  // namespace

std::vector<LoraLinear> lora_linears(const ModelConfig& cfg) { return model_family(cfg.arch).lora_linears(cfg); }

std::vector<LoraLinear> lora_targets(const ModelConfig& cfg) {
  const std::vector<LoraLinear> all = lora_linears(cfg);
  const std::string& spec = cfg.lora.targets;
  if (trimmed(spec) == "all") return all;
  std::vector<bool> chosen(all.size(), false);
  size_t begin = 0;
  while (begin <= spec.size()) {
    const size_t comma = std::min(spec.find(',', begin), spec.size());
    const std::string name = trimmed(spec.substr(begin, comma - begin));
    const auto it = std::find_if(all.begin(), all.end(), [&](const LoraLinear& l) { return l.name == name; });
    if (it == all.end())
      ST_BAD_INPUT("lora.targets ('", spec, "'): '", name, "' is no linear layer of a ", model_family(cfg.arch).name,
                   " block (expected all, or a comma-separated list of: ", names_of(all), ")");
    const size_t i = static_cast<size_t>(it - all.begin());
    if (chosen[i]) ST_BAD_INPUT("lora.targets ('", spec, "') names '", name, "' twice");
    chosen[i] = true;
    begin = comma + 1;
  }
  std::vector<LoraLinear> out;
  for (size_t i = 0; i < all.size(); ++i)
    if (chosen[i]) out.push_back(all[i]);
  return out;
}

float lora_scale(const LoraConfig& lora) {
  ST_CHECK(lora.rank > 0, "lora_scale without LoRA");
  const double r = static_cast<double>(lora.rank);
  return static_cast<float>(lora.alpha / (lora.rslora ? std::sqrt(r) : r));
}

std::vector<LoraAdapter> lora_adapters(const UnitLayout& unit, const ModelConfig& cfg) {
  std::vector<LoraAdapter> out;
  if (!cfg.lora.enabled() || unit.kind != UnitKind::kBlock) return out;
  for (const LoraLinear& l : lora_targets(cfg)) {
    LoraAdapter a;
    a.linear = l;
    a.rank = cfg.lora.rank;
    a.a_offset = unit.tensor(a_name(l)).offset;
    a.b_offset = unit.tensor(b_name(l)).offset;
    out.push_back(std::move(a));
  }
  return out;
}

std::vector<LoraAdapter> block_lora_adapters(const std::vector<UnitLayout>& units, const ModelConfig& cfg) {
  if (!cfg.lora.enabled() || cfg.n_layer == 0) return {};
  ST_ENFORCE_EQ(units.size(), static_cast<size_t>(cfg.n_layer) + 2);
  std::vector<LoraAdapter> adapters = lora_adapters(units[1], cfg);
  for (size_t l = 2; l + 1 < units.size(); ++l) {
    const std::vector<LoraAdapter> other = lora_adapters(units[l], cfg);
    for (size_t i = 0; i < adapters.size(); ++i)
      ST_CHECK(other[i].a_offset == adapters[i].a_offset && other[i].b_offset == adapters[i].b_offset,
               "LoRA adapters of ", units[l].name, " lie elsewhere than block.0's");
  }
  return adapters;
}

std::vector<int> lora_linear_indices(const std::vector<LoraAdapter>& adapters, const ModelConfig& cfg) {
  const std::vector<LoraLinear> linears = lora_linears(cfg);
  std::vector<int> out;
  for (const LoraAdapter& a : adapters) {
    const auto it =
        std::find_if(linears.begin(), linears.end(), [&](const LoraLinear& l) { return l.name == a.linear.name; });
    ST_CHECK(it != linears.end(), "adapter ", a.linear.name, " on no linear layer of the family");
    out.push_back(static_cast<int>(it - linears.begin()));
  }
  return out;
}

int64_t widest_lora_input(const std::vector<LoraAdapter>& adapters) {
  int64_t widest = 0;
  for (const LoraAdapter& a : adapters) widest = std::max(widest, a.linear.in);
  return widest;
}

int64_t lora_activation_elems(const ModelConfig& cfg, int64_t max_rows, int64_t slots) {
  if (!cfg.lora.enabled() || cfg.n_layer == 0) return 0;
  const std::vector<LoraLinear> targets = lora_targets(cfg);
  int64_t widest = 0;
  for (const LoraLinear& t : targets) widest = std::max(widest, t.in);
  // The most adapters on one weight: a stack (model/lora_run.h), whose dh is that wide.
  int64_t widest_stack = 0;
  for (size_t i = 0, run = 0; i < targets.size(); ++i) {
    run = i > 0 && targets[i].weight == targets[i - 1].weight ? run + 1 : 1;
    widest_stack = std::max<int64_t>(widest_stack, static_cast<int64_t>(run));
  }
  // h for each adapter of each slot, dh; with dropout the dropped input and its gradient, for the widest adapter.
  const int64_t dropout = cfg.lora.dropout > 0 ? 2 * max_rows * widest : 0;
  return (slots * static_cast<int64_t>(targets.size()) + widest_stack) * max_rows * cfg.lora.rank + dropout;
}

ModelConfig base_model(const ModelConfig& cfg) {
  ModelConfig base = cfg;
  base.lora = LoraConfig{};
  return base;
}

std::vector<float> merge_lora_unit(const ModelConfig& cfg, const UnitLayout& unit, const UnitLayout& base_unit,
                                   const std::vector<float>& full) {
  ST_CHECK(static_cast<int64_t>(full.size()) == unit.numel + unit.frozen_numel, "unit ", unit.name, " has ",
           full.size(), " elements, its layout ", unit.numel + unit.frozen_numel);
  std::vector<float> b(static_cast<size_t>(base_unit.numel), 0.0f);
  for (const TensorSpec& t : unit.tensors)
    if (t.frozen) std::copy(full.begin() + t.offset, full.begin() + t.offset + t.numel, b.begin() + t.init_index);
  const float scale = lora_scale(cfg.lora);
  for (const LoraAdapter& a : lora_adapters(unit, cfg)) {
    const TensorSpec& w = base_unit.tensor(a.linear.weight);
    add_lora_delta(b.data() + w.offset + a.linear.row0 * a.linear.in, full.data() + a.a_offset,
                   full.data() + a.b_offset, a.linear.rows, a.linear.in, a.rank, scale);
  }
  return b;
}

std::vector<std::vector<float>> merge_lora(const ModelConfig& cfg, const std::vector<UnitLayout>& units,
                                           std::vector<std::vector<float>> full) {
  if (!cfg.lora.enabled()) return full;
  const std::vector<UnitLayout> base_units = build_units(base_model(cfg));
  ST_ENFORCE_EQ(units.size(), base_units.size());
  ST_ENFORCE_EQ(full.size(), units.size());
  std::vector<std::vector<float>> out(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    if (full[u].empty()) continue;
    out[u] = merge_lora_unit(cfg, units[u], base_units[u], full[u]);
    std::vector<float>().swap(full[u]);  // one unit's two copies at a time
  }
  return out;
}

void add_lora_delta(float* w, const float* A, const float* B, int64_t rows, int64_t in, int64_t r, float scale) {
  for (int64_t i = 0; i < rows; ++i) {
    float* row = w + i * in;
    for (int64_t c = 0; c < in; ++c) {
      double sum = 0.0;
      for (int64_t k = 0; k < r; ++k) sum += static_cast<double>(B[i * r + k]) * A[k * in + c];
      row[c] = static_cast<float>(row[c] + scale * sum);
    }
  }
}

void add_lora(std::vector<UnitLayout>& units, const ModelConfig& cfg) {
  if (!cfg.lora.enabled()) return;
  const std::vector<LoraLinear> targets = lora_targets(cfg);
  for (UnitLayout& u : units) {
    for (TensorSpec& t : u.tensors) t.frozen = true;
    if (u.kind == UnitKind::kBlock) {
      // Every A, then every B: the adapters of one weight (llama's q, k, v; gate, up) lie stacked, A [count * r, in]
      // and B [their rows, r], so that they run as one (kernels/lora.h, LoraStack).
      for (const LoraLinear& l : targets)
        add_tensor(u, a_name(l), {cfg.lora.rank, l.in}, InitKind::kKaimingUniform, true);
      for (const LoraLinear& l : targets) add_tensor(u, b_name(l), {l.rows, cfg.lora.rank}, InitKind::kZeros, true);
    }
    // Each tensor keeps where it drew its initialisation from (adapters: past the base), and the trainable ones move
    // to the front.
    for (TensorSpec& t : u.tensors) t.init_index = t.offset;
    u.numel = 0;
    u.frozen_numel = 0;
    for (TensorSpec& t : u.tensors)
      if (!t.frozen) t.offset = u.numel, u.numel += t.numel;
    for (TensorSpec& t : u.tensors)
      if (t.frozen) t.offset = u.numel + u.frozen_numel, u.frozen_numel += t.numel;
    u.nf4_base = u.kind == UnitKind::kBlock && cfg.lora.base_dtype == LoraBase::kNf4;
    if (!u.nf4_base) continue;
    for (const LoraLinear& l : lora_linears(cfg)) {  // in each matrix's row order
      for (TensorSpec& t : u.tensors) {
        if (t.name != l.weight || l.rows == t.shape[0]) continue;
        int64_t row0 = 0;
        for (int64_t r : t.nf4_rows) row0 += r;
        ST_CHECK(row0 == l.row0, l.name, " starts at row ", l.row0, " of ", t.name, ", not after its layers so far");
        t.nf4_rows.push_back(l.rows);
      }
    }
  }
}

}  // namespace st
