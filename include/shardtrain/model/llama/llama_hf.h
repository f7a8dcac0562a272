// The llama family's tensors under Hugging Face's names (LlamaForCausalLM, Qwen2ForCausalLM), for init.from of a
// model directory and `shardtrain ckpt export`.
//
// Every Hugging Face tensor is a contiguous range of one unit's flat buffer in the same row-major order, so the
// mapping is an offset, never a transpose. Hugging Face's q_proj/k_proj rows are already in the rotate-half layout
// the RoPE here uses (Meta's original checkpoints would need a permutation; Hugging Face's conversion applied it).
//
//   model.embed_tokens.weight [V, C]              embedding  embed_tokens rows [0, V) (the padding rows: none)
//   model.layers.{l}.input_layernorm.weight       block.l    attn_norm.weight
//   model.layers.{l}.self_attn.q_proj.weight      block.l    attn.qkv.weight rows [0, H D)
//   model.layers.{l}.self_attn.k_proj.weight      block.l    attn.qkv.weight rows [H D, (H + KV) D)
//   model.layers.{l}.self_attn.v_proj.weight      block.l    attn.qkv.weight rows [(H + KV) D, (H + 2 KV) D)
//   model.layers.{l}.self_attn.{q,k,v}_proj.bias  block.l    attn.qkv.bias, the same ranges (qkv_bias only)
//   model.layers.{l}.self_attn.o_proj.weight      block.l    attn.o.weight
//   model.layers.{l}.post_attention_layernorm.weight  block.l  mlp_norm.weight
//   model.layers.{l}.mlp.gate_proj.weight         block.l    mlp.gate_up.weight rows [0, F)
//   model.layers.{l}.mlp.up_proj.weight           block.l    mlp.gate_up.weight rows [F, 2F)
//   model.layers.{l}.mlp.down_proj.weight         block.l    mlp.down.weight
//   model.norm.weight                             head       norm.weight
//   lm_head.weight [V, C]                         head       lm_head rows [0, V) (untied only)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/units.h"

namespace st {

struct HfRange {
  std::string hf_name;            // "model.layers.0.self_attn.k_proj.weight"
  std::vector<int64_t> hf_shape;  // as Hugging Face stores it
  int unit = 0;                   // index into the unit list
  int64_t offset = 0;             // first element in the unit's flat buffer
  int64_t numel = 0;              // product of hf_shape
};

// Every tensor of the model, in the order above (layer by layer). kBadInput unless cfg is model.arch=llama.
std::vector<HfRange> llama_hf_tensor_map(const ModelConfig& cfg, const std::vector<UnitLayout>& units);

}  // namespace st
