#include "shardtrain/train/mfu.h"

#include "shardtrain/model/family.h"

namespace st {
namespace {

struct Peak {
  const char* name_part;  // matched as a substring of the device name
  double flops;
};
// Order matters: the first match wins ("H100 PCIe" before "H100").
constexpr Peak kPeaks[] = {
    {"H100 PCIe", 756e12}, {"H100 NVL", 835e12}, {"H100", 989e12},         {"H200", 989e12},  // GH200 too
    {"H800", 989e12},      {"A100", 312e12},     {"RTX 4090", 165.2e12},  {"L40S", 362e12},
};

}  // namespace

double flops_per_token(const ModelConfig& cfg) {
  const double attention = 6.0 * static_cast<double>(cfg.n_layer) * cfg.n_embd * static_cast<double>(cfg.seq_len);
  const double params = static_cast<double>(model_family(cfg.arch).flop_params(cfg));
  if (!cfg.lora.enabled()) return 6.0 * params + attention;
  // A frozen weight needs its forward and its input gradient, not its weight gradient: 4 per parameter; each adapter
  // parameter all 6 (the peers' count: PEFT's benchmark counts the same).
  return 4.0 * params + 6.0 * static_cast<double>(count_trainable_params(build_units(cfg))) + attention;
}

std::optional<double> dense_bf16_peak(const std::string& device_name) {
  for (const Peak& p : kPeaks)
    if (device_name.find(p.name_part) != std::string::npos) return p.flops;
  return std::nullopt;
}

std::optional<double> mfu(double flops_per_token, double tokens_per_s, int devices, const std::string& device_name) {
  const std::optional<double> peak = dense_bf16_peak(device_name);
  if (!peak || devices <= 0) return std::nullopt;
  return tokens_per_s * flops_per_token / (*peak * devices);
}

}  // namespace st
