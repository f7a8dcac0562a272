// GPT-2: its unit list, FLOP count, CPU model and CPU decoder.
#include "shardtrain/model/family.h"
#include "shardtrain/model/gpt2/gpt_decoder.h"
#include "shardtrain/model/gpt2/gpt_model.h"

namespace st {
namespace {

std::vector<UnitLayout> gpt2_units(const ModelConfig& cfg) {
  const int64_t C = cfg.n_embd, Vp = cfg.padded_vocab(), T = cfg.seq_len;
  std::vector<UnitLayout> units;

  UnitLayout emb;
  emb.kind = UnitKind::kEmbedding;
  emb.name = "embedding";
  add_tensor(emb, "wte", {Vp, C}, InitKind::kEmbeddingPadded, false);
  add_tensor(emb, "wpe", {T, C}, InitKind::kNormal, false);
  units.push_back(std::move(emb));

  for (int l = 0; l < cfg.n_layer; ++l) {
    UnitLayout b;
    b.kind = UnitKind::kBlock;
    b.layer = l;
    b.name = "block." + std::to_string(l);
    add_tensor(b, "ln1.weight", {C}, InitKind::kOnes, false);
    add_tensor(b, "ln1.bias", {C}, InitKind::kZeros, false);
    add_tensor(b, "attn.qkv.weight", {3 * C, C}, InitKind::kNormal, true);
    add_tensor(b, "attn.qkv.bias", {3 * C}, InitKind::kZeros, false);
    add_tensor(b, "attn.proj.weight", {C, C}, InitKind::kResidualProj, true);
    add_tensor(b, "attn.proj.bias", {C}, InitKind::kZeros, false);
    add_tensor(b, "ln2.weight", {C}, InitKind::kOnes, false);
    add_tensor(b, "ln2.bias", {C}, InitKind::kZeros, false);
    add_tensor(b, "mlp.fc.weight", {4 * C, C}, InitKind::kNormal, true);
    add_tensor(b, "mlp.fc.bias", {4 * C}, InitKind::kZeros, false);
    add_tensor(b, "mlp.proj.weight", {C, 4 * C}, InitKind::kResidualProj, true);
    add_tensor(b, "mlp.proj.bias", {C}, InitKind::kZeros, false);
    units.push_back(std::move(b));
  }

  UnitLayout head;
  head.kind = UnitKind::kHead;
  head.name = "head";
  add_tensor(head, "lnf.weight", {C}, InitKind::kOnes, false);
  add_tensor(head, "lnf.bias", {C}, InitKind::kZeros, false);
  units.push_back(std::move(head));
  return units;
}

// llm.c's convention: every parameter, wpe and the padding rows included.
int64_t gpt2_flop_params(const ModelConfig& cfg) { return count_params(gpt2_units(cfg)); }

std::vector<LoraLinear> gpt2_lora_linears(const ModelConfig& cfg) {
  const int64_t C = cfg.n_embd;
  return {{"qkv", "attn.qkv.weight", 0, 3 * C, C, "attn.c_attn"},
          {"proj", "attn.proj.weight", 0, C, C, "attn.c_proj"},
          {"fc", "mlp.fc.weight", 0, 4 * C, C, "mlp.c_fc"},
          {"fc_proj", "mlp.proj.weight", 0, C, 4 * C, "mlp.c_proj"}};
}

std::unique_ptr<UnitModel> make_gpt2(const ModelConfig& cfg, int64_t max_batch, Recompute recompute) {
  return std::make_unique<GptModel>(cfg, max_batch, recompute);
}

std::unique_ptr<Decoder> make_gpt2_decoder(const ModelConfig& cfg, int max_batch, const DecoderStage& stage) {
  return std::make_unique<GptDecoder>(cfg, max_batch, stage);
}

}  // namespace

const ModelFamily& gpt2_family() {
  static const ModelFamily f{ModelArch::kGpt2,  "gpt2",           gpt2_units,
                             gpt2_flop_params,  make_gpt2,        GptModel::footprint_bytes,
                             make_gpt2_decoder, gpt2_lora_linears};
  return f;
}

}  // namespace st
