#include "shardtrain/model/llama/llama_hf.h"

#include "shardtrain/core/error.h"

namespace st {

std::vector<HfRange> llama_hf_tensor_map(const ModelConfig& cfg, const std::vector<UnitLayout>& units) {
  if (cfg.arch != ModelArch::kLlama)
    ST_BAD_INPUT("this model is model.arch=", to_string(cfg.arch), "; Hugging Face llama names apply to llama only");
  const int64_t C = cfg.n_embd, V = cfg.vocab_size, D = cfg.head_dim(), H = cfg.n_head, KV = cfg.kv_heads(),
                F = cfg.mlp_dim();
  std::vector<HfRange> out;
  // `rows` rows of `width` starting at row `row0` of tensor `t` of unit `u`.
  auto add = [&](std::string name, const UnitLayout& u, const std::string& t, int64_t row0, int64_t rows,
                 int64_t width) {
    const TensorSpec& spec = u.tensor(t);
    HfRange r;
    r.hf_name = std::move(name);
    r.hf_shape = width == 0 ? std::vector<int64_t>{rows} : std::vector<int64_t>{rows, width};
    r.unit = u.index;
    r.offset = spec.offset + row0 * (width == 0 ? 1 : width);
    r.numel = rows * (width == 0 ? 1 : width);
    out.push_back(std::move(r));
  };
  for (const UnitLayout& u : units) {
    switch (u.kind) {
      case UnitKind::kEmbedding:
        add("model.embed_tokens.weight", u, "embed_tokens", 0, V, C);
        break;
      case UnitKind::kBlock: {
        const std::string p = "model.layers." + std::to_string(u.layer) + ".";
        add(p + "input_layernorm.weight", u, "attn_norm.weight", 0, C, 0);
        const int64_t q0 = 0, k0 = H * D, v0 = (H + KV) * D;
        add(p + "self_attn.q_proj.weight", u, "attn.qkv.weight", q0, H * D, C);
        add(p + "self_attn.k_proj.weight", u, "attn.qkv.weight", k0, KV * D, C);
        add(p + "self_attn.v_proj.weight", u, "attn.qkv.weight", v0, KV * D, C);
        if (cfg.qkv_bias) {
          add(p + "self_attn.q_proj.bias", u, "attn.qkv.bias", q0, H * D, 0);
          add(p + "self_attn.k_proj.bias", u, "attn.qkv.bias", k0, KV * D, 0);
          add(p + "self_attn.v_proj.bias", u, "attn.qkv.bias", v0, KV * D, 0);
        }
        add(p + "self_attn.o_proj.weight", u, "attn.o.weight", 0, C, C);
        add(p + "post_attention_layernorm.weight", u, "mlp_norm.weight", 0, C, 0);
        add(p + "mlp.gate_proj.weight", u, "mlp.gate_up.weight", 0, F, C);
        add(p + "mlp.up_proj.weight", u, "mlp.gate_up.weight", F, F, C);
        add(p + "mlp.down_proj.weight", u, "mlp.down.weight", 0, C, F);
        break;
      }
      case UnitKind::kHead:
        add("model.norm.weight", u, "norm.weight", 0, C, 0);
        if (!cfg.tie_embeddings) add("lm_head.weight", u, "lm_head", 0, V, C);
        break;
    }
  }
  return out;
}

}  // namespace st
