// Llama (Hugging Face's LlamaForCausalLM; Qwen2ForCausalLM with q/k/v biases): its unit list, FLOP count, CPU model and
// CPU decoder. Initialisation as Hugging Face's: every matrix N(0, 0.02), norms 1, biases 0. Weight decay on the
// blocks' matrices only, as for gpt2.
#include "shardtrain/model/family.h"
#include "shardtrain/model/llama/llama_decoder.h"
#include "shardtrain/model/llama/llama_model.h"

namespace st {
namespace {

std::vector<UnitLayout> llama_units(const ModelConfig& cfg) {
  const int64_t C = cfg.n_embd, Vp = cfg.padded_vocab(), QKV = cfg.qkv_dim(), F = cfg.mlp_dim();
  std::vector<UnitLayout> units;

  UnitLayout emb;
  emb.kind = UnitKind::kEmbedding;
  emb.name = "embedding";
  add_tensor(emb, "embed_tokens", {Vp, C}, InitKind::kEmbeddingPadded, false);
  units.push_back(std::move(emb));

  for (int l = 0; l < cfg.n_layer; ++l) {
    UnitLayout b;
    b.kind = UnitKind::kBlock;
    b.layer = l;
    b.name = "block." + std::to_string(l);
    add_tensor(b, "attn_norm.weight", {C}, InitKind::kOnes, false);
    add_tensor(b, "attn.qkv.weight", {QKV, C}, InitKind::kNormal, true);
    if (cfg.qkv_bias) add_tensor(b, "attn.qkv.bias", {QKV}, InitKind::kZeros, false);
    add_tensor(b, "attn.o.weight", {C, C}, InitKind::kNormal, true);
    add_tensor(b, "mlp_norm.weight", {C}, InitKind::kOnes, false);
    add_tensor(b, "mlp.gate_up.weight", {2 * F, C}, InitKind::kNormal, true);
    add_tensor(b, "mlp.down.weight", {C, F}, InitKind::kNormal, true);
    units.push_back(std::move(b));
  }

  UnitLayout head;
  head.kind = UnitKind::kHead;
  head.name = "head";
  add_tensor(head, "norm.weight", {C}, InitKind::kOnes, false);
  if (!cfg.tie_embeddings) add_tensor(head, "lm_head", {Vp, C}, InitKind::kEmbeddingPadded, false);
  units.push_back(std::move(head));
  return units;
}

// Every parameter with the vocabulary's table counted once (the classifier; the input lookup is no matrix product),
// at the real vocabulary: the count of the Hugging Face peer (norms and biases, 0.01% of it, included).
int64_t llama_flop_params(const ModelConfig& cfg) {
  int64_t n = 0;
  for (const UnitLayout& u : llama_units(cfg))
    if (u.kind != UnitKind::kEmbedding) n += u.numel + u.frozen_numel;
  if (!cfg.tie_embeddings) n -= int64_t{cfg.padded_vocab()} * cfg.n_embd;  // lm_head, counted below
  return n + int64_t{cfg.vocab_size} * cfg.n_embd;
}

std::vector<LoraLinear> llama_lora_linears(const ModelConfig& cfg) {
  const int64_t C = cfg.n_embd, Q = int64_t{cfg.n_head} * cfg.head_dim(), KV = int64_t{cfg.kv_heads()} * cfg.head_dim(),
                F = cfg.mlp_dim();
  return {{"q", "attn.qkv.weight", 0, Q, C, "self_attn.q_proj"},
          {"k", "attn.qkv.weight", Q, KV, C, "self_attn.k_proj"},
          {"v", "attn.qkv.weight", Q + KV, KV, C, "self_attn.v_proj"},
          {"o", "attn.o.weight", 0, C, C, "self_attn.o_proj"},
          {"gate", "mlp.gate_up.weight", 0, F, C, "mlp.gate_proj"},
          {"up", "mlp.gate_up.weight", F, F, C, "mlp.up_proj"},
          {"down", "mlp.down.weight", 0, C, F, "mlp.down_proj"}};
}

std::unique_ptr<UnitModel> make_llama(const ModelConfig& cfg, int64_t max_batch, Recompute recompute) {
  return std::make_unique<LlamaModel>(cfg, max_batch, recompute);
}

std::unique_ptr<Decoder> make_llama_decoder(const ModelConfig& cfg, int max_batch, const DecoderStage& stage) {
  return std::make_unique<LlamaDecoder>(cfg, max_batch, stage);
}

}  // namespace

const ModelFamily& llama_family() {
  static const ModelFamily f{ModelArch::kLlama,  "llama",           llama_units,
                             llama_flop_params,  make_llama,        LlamaModel::footprint_bytes,
                             make_llama_decoder, llama_lora_linears};
  return f;
}

}  // namespace st
