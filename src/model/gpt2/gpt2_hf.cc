#include "shardtrain/model/gpt2/gpt2_hf.h"

#include <algorithm>
#include <map>
#include <utility>

#include "shardtrain/core/error.h"

namespace st {
namespace {

// Our tensor name within a block -> HF suffix, and whether it is a Conv1D matrix.
const std::map<std::string, std::pair<std::string, bool>>& block_names() {
  static const std::map<std::string, std::pair<std::string, bool>> m = {
      {"ln1.weight", {"ln_1.weight", false}},          {"ln1.bias", {"ln_1.bias", false}},
      {"attn.qkv.weight", {"attn.c_attn.weight", true}}, {"attn.qkv.bias", {"attn.c_attn.bias", false}},
      {"attn.proj.weight", {"attn.c_proj.weight", true}}, {"attn.proj.bias", {"attn.c_proj.bias", false}},
      {"ln2.weight", {"ln_2.weight", false}},          {"ln2.bias", {"ln_2.bias", false}},
      {"mlp.fc.weight", {"mlp.c_fc.weight", true}},    {"mlp.fc.bias", {"mlp.c_fc.bias", false}},
      {"mlp.proj.weight", {"mlp.c_proj.weight", true}}, {"mlp.proj.bias", {"mlp.c_proj.bias", false}},
  };
  return m;
}

}  // namespace

// Blocked, so both sides stay in cache.
void transpose_2d(const float* in, float* out, int64_t rows, int64_t cols) {
  constexpr int64_t kB = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kB)
    for (int64_t c0 = 0; c0 < cols; c0 += kB)
      for (int64_t r = r0; r < std::min(r0 + kB, rows); ++r)
        for (int64_t c = c0; c < std::min(c0 + kB, cols); ++c) out[c * rows + r] = in[r * cols + c];
}

std::vector<HfTensorMap> hf_gpt2_tensor_map(const ModelConfig& cfg, const std::vector<UnitLayout>& units) {
  if (cfg.arch != ModelArch::kGpt2)
    ST_BAD_INPUT("this model is model.arch=", to_string(cfg.arch), "; GPT-2 Hugging Face names apply to gpt2 only");
  std::vector<HfTensorMap> out;
  for (const UnitLayout& u : units) {
    for (const TensorSpec& t : u.tensors) {
      if (cfg.lora.enabled() && !t.frozen) continue;  // an adapter: no tensor of the Hugging Face model
      HfTensorMap m;
      m.unit = u.index;
      m.tensor = &t;
      m.hf_shape = t.shape;
      switch (u.kind) {
        case UnitKind::kEmbedding:
          m.hf_name = "transformer." + t.name + ".weight";
          if (t.name == "wte") m.hf_shape = {cfg.vocab_size, t.shape[1]};
          break;
        case UnitKind::kBlock: {
          const auto& [suffix, conv1d] = block_names().at(t.name);
          m.hf_name = "transformer.h." + std::to_string(u.layer) + "." + suffix;
          m.transpose = conv1d;
          if (conv1d) m.hf_shape = {t.shape[1], t.shape[0]};
          break;
        }
        case UnitKind::kHead:
          m.hf_name = "transformer.ln_f." + t.name.substr(t.name.find('.') + 1);
          break;
      }
      out.push_back(std::move(m));
    }
  }
  return out;
}

}  // namespace st
