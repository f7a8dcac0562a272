#include "shardtrain/model/fp8_policy.h"

#include <algorithm>
#include <set>

#include "shardtrain/core/error.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/units.h"

namespace st {

Fp8Policy fp8_policy(Fp8Recipe recipe, int amax_history) {
  Fp8Policy p;
  p.recipe = recipe;
  if (recipe == Fp8Recipe::kDelayed) p.amax_history = amax_history;
  const bool rowwise = recipe == Fp8Recipe::kRowwise;
  p.power_of_2 = rowwise;
  const auto op = [&](Fp8Format f, Fp8Scaling s) { return Fp8Operand{f, rowwise ? s : Fp8Scaling::kTensor}; };
  p.forward = {op(Fp8Format::kE4M3, Fp8Scaling::kRow), op(Fp8Format::kE4M3, Fp8Scaling::kRow)};
  p.input_grad = {op(Fp8Format::kE5M2, Fp8Scaling::kRow), op(Fp8Format::kE4M3, Fp8Scaling::kColumn)};
  p.weight_grad = {op(Fp8Format::kE5M2, Fp8Scaling::kColumn), op(Fp8Format::kE4M3, Fp8Scaling::kColumn)};
  return p;
}

std::vector<LinearShape> block_linear_shapes(const ModelConfig& cfg) {
  std::vector<LinearShape> out;
  if (cfg.n_layer == 0) return out;
  const UnitLayout block = build_units(base_model(cfg))[1];
  std::set<std::string> seen;
  for (const LoraLinear& l : lora_linears(cfg)) {
    if (!seen.insert(l.weight).second) continue;
    const TensorSpec& t = block.tensor(l.weight);
    out.push_back({t.shape[0], t.shape[1], l.weight});
  }
  return out;
}

int64_t fp8_site_index(const std::vector<LinearShape>& weights, int n_layer, LinearSite site) {
  const auto it =
      std::find_if(weights.begin(), weights.end(), [&](const LinearShape& l) { return l.weight == site.weight; });
  ST_CHECK(it != weights.end(), "'", site.weight, "' is none of the blocks' linear layers");
  ST_CHECK(site.layer >= 0 && site.layer < n_layer, "linear layer site at block ", site.layer, ", outside the model's ",
           n_layer, " blocks");
  return static_cast<int64_t>(site.layer) * static_cast<int64_t>(weights.size()) + (it - weights.begin());
}

bool Fp8Policy::keeps_input_codes(int64_t in, int64_t out) const {
  return keep_input_codes && applies(in, out) && fp8_kept_maxima(*this).x;
}

bool fp8_input_codes(const ModelConfig& cfg, const Fp8Policy& policy, const LinearShape& l) {
  return policy.keeps_input_codes(l.in, l.out) && !cfg.lora.enabled() && policy.weight_grad_applies(cfg.seq_len);
}

Fp8KeptMaxima fp8_kept_maxima(const Fp8Policy& policy) {
  const auto whole = [](const Fp8Operand& a, const Fp8Operand& b) {
    return a.scaling == Fp8Scaling::kTensor && b.scaling == Fp8Scaling::kTensor;
  };
  return {whole(policy.forward.a, policy.weight_grad.b), whole(policy.forward.b, policy.input_grad.b),
          whole(policy.input_grad.a, policy.weight_grad.a)};
}

Fp8Workspace fp8_workspace(const ModelConfig& cfg, int64_t max_rows, const Fp8Policy& policy) {
  Fp8Workspace w;
  const std::vector<LinearShape> shapes = block_linear_shapes(cfg);
  bool coded = false;
  for (const LinearShape& s : shapes) {
    if (!policy.applies(s.in, s.out)) continue;
    w.a = std::max({w.a, max_rows * s.in, max_rows * s.out});
    w.b = std::max({w.b, s.out * s.in, max_rows * s.in});
    w.t = std::max(w.t, max_rows * s.out);
    w.groups = std::max({w.groups, max_rows, s.in, s.out});
    coded = coded || fp8_input_codes(cfg, policy, s);
  }
  if (w.a == 0) return w;
  const int64_t sites = int64_t{cfg.n_layer} * static_cast<int64_t>(shapes.size());
  if (fp8_kept_maxima(policy).any()) w.kept_maxima = sites * Fp8Workspace::kMaximaPerSite;
  if (coded) w.input_scales = sites * Fp8Workspace::kInputScaleStride;
  return w;
}

}  // namespace st
