#include "shardtrain/model/gpt2/gpt_model.h"

#include <algorithm>
#include <cstring>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/attention.h"
#include "shardtrain/kernels/embedding.h"
#include "shardtrain/kernels/gelu.h"
#include "shardtrain/kernels/layernorm.h"
#include "shardtrain/kernels/matmul.h"
#include "shardtrain/model/classifier.h"
#include "shardtrain/model/gpt2/block_view.h"

namespace st {
namespace {

void zero(std::vector<float>& v, int64_t n) { std::memset(v.data(), 0, sizeof(float) * static_cast<size_t>(n)); }

}  // namespace

GptModel::GptModel(const ModelConfig& cfg, int64_t max_batch, Recompute recompute)
    : cfg_(cfg),
      units_(build_units(cfg)),
      max_batch_(max_batch),
      recompute_(recompute),
      lora_(cfg, units_, max_batch * cfg.seq_len, recompute) {
  ST_CHECK(max_batch > 0);
  const int64_t BT = max_batch * cfg.seq_len, C = cfg.n_embd, NH = cfg.n_head, T = cfg.seq_len;
  tokens_.resize(BT);
  encoded_.resize(BT * C);
  blocks_.resize(static_cast<size_t>(recompute.sets(cfg.n_layer)));
  block_out_.assign(cfg.n_layer, std::vector<float>(BT * C));
  for (BlockActs& a : blocks_) {
    a.ln1.resize(BT * C);
    a.ln1_mean.resize(BT);
    a.ln1_rstd.resize(BT);
    a.qkv.resize(BT * 3 * C);
    a.att.resize(max_batch * NH * T * T);
    a.atty.resize(BT * C);
    a.res2.resize(BT * C);
    a.ln2.resize(BT * C);
    a.ln2_mean.resize(BT);
    a.ln2_rstd.resize(BT);
    a.fch.resize(BT * 4 * C);
    a.fch_gelu.resize(BT * 4 * C);
  }
  lnf_.resize(BT * C);
  lnf_mean_.resize(BT);
  lnf_rstd_.resize(BT);
  losses_.resize(BT);
  dresid_.resize(BT * C);
  dlnf_.resize(BT * C);
  dbuf_c_.resize(BT * C);
  dqkv_.resize(BT * 3 * C);
  dfch_.resize(BT * 8 * C);  // dfch_gelu and dfch, back to back
  const int64_t Vp = cfg.padded_vocab();
  const int64_t chunk_rows = classifier_chunk_rows(BT, Vp);
  logits_chunk_.resize(chunk_rows * Vp);
}

int64_t GptModel::footprint_bytes(const ModelConfig& cfg, int64_t max_batch, Recompute recompute) {
  const int64_t BT = max_batch * cfg.seq_len, C = cfg.n_embd, T = cfg.seq_len, Vp = cfg.padded_vocab();
  const int64_t blocks = recompute.sets(cfg.n_layer);
  // Per block: ln1, atty, res2, ln2 (BT x C), qkv (3), fch and fch_gelu (4 each); four BT statistics; att.
  const int64_t per_block = 15 * BT * C + 4 * BT + max_batch * cfg.n_head * T * T;
  const int64_t chunk_rows = classifier_chunk_rows(BT, Vp);
  const int64_t floats = blocks * per_block + cfg.n_layer * BT * C  // block outputs
                         + BT * C + BT * C + 3 * BT                 // encoded, lnf and its statistics, losses
                         + 3 * BT * C + 3 * BT * C + 8 * BT * C     // dresid, dlnf, dbuf_c; dqkv; dfch
                         + chunk_rows * Vp + CpuLora::footprint_floats(cfg, BT, blocks);
  return floats * static_cast<int64_t>(sizeof(float)) + BT * static_cast<int64_t>(sizeof(int32_t));  // + tokens
}

int64_t GptModel::allocated_bytes() const {
  auto bytes = [](const auto& v) { return static_cast<int64_t>(v.size() * sizeof(v[0])); };
  int64_t n = bytes(tokens_) + bytes(encoded_) + bytes(lnf_) + bytes(lnf_mean_) + bytes(lnf_rstd_) + bytes(losses_) +
              bytes(dresid_) + bytes(dlnf_) + bytes(dbuf_c_) + bytes(dqkv_) + bytes(dfch_) + bytes(logits_chunk_) +
              lora_.allocated_floats() * static_cast<int64_t>(sizeof(float));
  for (const std::vector<float>& o : block_out_) n += bytes(o);
  for (const BlockActs& a : blocks_)
    for (const std::vector<float>* v : {&a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.att, &a.atty, &a.res2, &a.ln2,
                                        &a.ln2_mean, &a.ln2_rstd, &a.fch, &a.fch_gelu})
      n += bytes(*v);
  return n;
}

const float* GptModel::block_input(int layer) const {
  return layer == 0 ? encoded_.data() : block_out_[layer - 1].data();
}

void GptModel::embedding_forward(const float* emb_params, const int32_t* tokens, int64_t B, int64_t t) {
  ST_CHECK(B >= 1 && B <= max_batch_ && t >= 1 && t <= cfg_.seq_len, "shape [", B, ", ", t, "] exceeds [", max_batch_,
           ", ", cfg_.seq_len, "]");
  B_ = B;
  T_ = t;
  lora_.set_batch(dropout_seed_, first_sequence_, t);
  std::copy(tokens, tokens + B * t, tokens_.begin());
  const UnitLayout& u = units_[0];
  st::embedding_forward(encoded_.data(), tokens_.data(), emb_params + u.tensor("wte").offset,
                        emb_params + u.tensor("wpe").offset, static_cast<int>(B), static_cast<int>(t), cfg_.n_embd);
}

void GptModel::block_forward(int layer, const float* block_params) {
  const BlockView<const float> p(block_params, units_[1 + layer]);
  BlockActs& a = acts(layer);
  float* out = block_out_[layer].data();
  const int64_t N = B_ * T_;
  const int C = cfg_.n_embd;
  const float* x = block_input(layer);
  layernorm_forward(a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), x, p.ln1w, p.ln1b, N, C);
  linear_.forward(a.qkv.data(), a.ln1.data(), p.qkvw, p.qkvb, nullptr, N, C, 3 * C, {layer, "attn.qkv.weight"});
  lora_.forward(layer, "attn.qkv.weight", block_params, a.qkv.data(), 3 * C, a.ln1.data(), N);
  attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), static_cast<int>(B_), static_cast<int>(T_), C,
                    cfg_.n_head);
  linear_.forward(a.res2.data(), a.atty.data(), p.projw, p.projb, nullptr, N, C, C, {layer, "attn.proj.weight"});
  lora_.forward(layer, "attn.proj.weight", block_params, a.res2.data(), C, a.atty.data(), N);
  residual_forward(a.res2.data(), a.res2.data(), x, N * C);
  layernorm_forward(a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(), a.res2.data(), p.ln2w, p.ln2b, N, C);
  linear_.forward(a.fch.data(), a.ln2.data(), p.fcw, p.fcb, nullptr, N, C, 4 * C, {layer, "mlp.fc.weight"});
  lora_.forward(layer, "mlp.fc.weight", block_params, a.fch.data(), 4 * C, a.ln2.data(), N);
  gelu_forward(a.fch_gelu.data(), a.fch.data(), N * 4 * C);
  linear_.forward(out, a.fch_gelu.data(), p.fcprojw, p.fcprojb, nullptr, N, 4 * C, C, {layer, "mlp.proj.weight"});
  lora_.forward(layer, "mlp.proj.weight", block_params, out, C, a.fch_gelu.data(), N);
  residual_forward(out, out, a.res2.data(), N * C);
}

double GptModel::head_forward_backward(const float* head_params, const float* emb_params, const int32_t* targets,
                                       float dloss, float* head_grads, float* emb_grads) {
  return head_pass(head_params, emb_params, targets, dloss, head_grads, emb_grads, true);
}

double GptModel::head_forward(const float* head_params, const float* emb_params, const int32_t* targets) {
  return head_pass(head_params, emb_params, targets, 0.0f, nullptr, nullptr, false);
}

double GptModel::head_pass(const float* head_params, const float* emb_params, const int32_t* targets, float dloss,
                           float* head_grads, float* emb_grads, bool backward) {
  const UnitLayout& hu = units_.back();
  const UnitLayout& eu = units_[0];
  const int64_t N = B_ * T_;
  const int C = cfg_.n_embd, V = cfg_.vocab_size, Vp = cfg_.padded_vocab();
  const float* x = cfg_.n_layer > 0 ? block_out_.back().data() : encoded_.data();
  const float* lnfw = head_params + hu.tensor("lnf.weight").offset;
  const float* lnfb = head_params + hu.tensor("lnf.bias").offset;
  const float* wte = emb_params + eu.tensor("wte").offset;
  layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), x, lnfw, lnfb, N, C);
  if (backward) zero(dlnf_, N * C);

  const double loss_sum = chunked_classifier(
      lnf_.data(), wte, targets, N, C, V, Vp, dloss, logits_chunk_.data(), losses_.data(),
      backward ? dlnf_.data() : nullptr, backward ? tensor_in(emb_grads, eu.tensor("wte"), ViewOf::kGrads) : nullptr);
  if (backward) {
    zero(dresid_, N * C);
    layernorm_backward(dresid_.data(), tensor_in(head_grads, hu.tensor("lnf.weight"), ViewOf::kGrads),
                       tensor_in(head_grads, hu.tensor("lnf.bias"), ViewOf::kGrads), dlnf_.data(), x, lnfw,
                       lnf_mean_.data(), lnf_rstd_.data(), N, C);
  }
  return loss_sum;
}

void GptModel::head_logits(const float* head_params, const float* emb_params, int64_t pos, std::vector<float>* logits) {
  ST_CHECK(pos >= 0 && pos < T_, "position ", pos, " outside the active length ", T_);
  const UnitLayout& hu = units_.back();
  const int C = cfg_.n_embd, Vp = cfg_.padded_vocab();
  const float* x = (cfg_.n_layer > 0 ? block_out_.back().data() : encoded_.data()) + pos * C;
  float mean = 0, rstd = 0;
  std::vector<float> row(C);
  layernorm_forward(row.data(), &mean, &rstd, x, head_params + hu.tensor("lnf.weight").offset,
                    head_params + hu.tensor("lnf.bias").offset, 1, C);
  logits->assign(Vp, 0.0f);
  matmul_forward(logits->data(), row.data(), emb_params + units_[0].tensor("wte").offset, nullptr, 1, C, Vp);
  logits->resize(cfg_.vocab_size);
}

void GptModel::block_backward(int layer, const float* block_params, float* block_grads) {
  if (recompute_.of(layer)) block_forward(layer, block_params);  // refills the shared activations from its input
  const BlockView<const float> p(block_params, units_[1 + layer]);
  const BlockView<float> g(block_grads, units_[1 + layer], ViewOf::kGrads);
  BlockActs& a = acts(layer);
  const int64_t N = B_ * T_;
  const int C = cfg_.n_embd;
  const float* x = block_input(layer);
  float* dfch_gelu = dfch_.data();
  float* dfch = dfch_.data() + N * 4 * C;

  // MLP branch: dresid is d(out); the residual passes it to res2 unchanged.
  std::memset(dfch_.data(), 0, sizeof(float) * static_cast<size_t>(N * 8 * C));
  linear_.backward(dfch_gelu, g.fcprojw, g.fcprojb, dresid_.data(), a.fch_gelu.data(), p.fcprojw, N, 4 * C, C,
                   GradWrite::kAccumulate, GradWrite::kAccumulate, {layer, "mlp.proj.weight"});
  lora_.backward(layer, "mlp.proj.weight", block_params, block_grads, dfch_gelu, dresid_.data(), C, a.fch_gelu.data(),
                 N);
  gelu_backward(dfch, a.fch.data(), dfch_gelu, N * 4 * C);
  zero(dbuf_c_, N * C);
  linear_.backward(dbuf_c_.data(), g.fcw, g.fcb, dfch, a.ln2.data(), p.fcw, N, C, 4 * C, GradWrite::kAccumulate,
                   GradWrite::kAccumulate, {layer, "mlp.fc.weight"});
  lora_.backward(layer, "mlp.fc.weight", block_params, block_grads, dbuf_c_.data(), dfch, 4 * C, a.ln2.data(), N);
  layernorm_backward(dresid_.data(), g.ln2w, g.ln2b, dbuf_c_.data(), a.res2.data(), p.ln2w, a.ln2_mean.data(),
                     a.ln2_rstd.data(), N, C);

  // Attention branch: dresid is now d(res2); the residual passes it to x unchanged.
  zero(dbuf_c_, N * C);
  linear_.backward(dbuf_c_.data(), g.projw, g.projb, dresid_.data(), a.atty.data(), p.projw, N, C, C,
                   GradWrite::kAccumulate, GradWrite::kAccumulate, {layer, "attn.proj.weight"});
  lora_.backward(layer, "attn.proj.weight", block_params, block_grads, dbuf_c_.data(), dresid_.data(), C, a.atty.data(),
                 N);
  zero(dqkv_, N * 3 * C);
  attention_backward(dqkv_.data(), dbuf_c_.data(), a.qkv.data(), a.att.data(), static_cast<int>(B_),
                     static_cast<int>(T_), C, cfg_.n_head);
  zero(dbuf_c_, N * C);
  linear_.backward(dbuf_c_.data(), g.qkvw, g.qkvb, dqkv_.data(), a.ln1.data(), p.qkvw, N, C, 3 * C,
                   GradWrite::kAccumulate, GradWrite::kAccumulate, {layer, "attn.qkv.weight"});
  lora_.backward(layer, "attn.qkv.weight", block_params, block_grads, dbuf_c_.data(), dqkv_.data(), 3 * C, a.ln1.data(),
                 N);
  layernorm_backward(dresid_.data(), g.ln1w, g.ln1b, dbuf_c_.data(), x, p.ln1w, a.ln1_mean.data(), a.ln1_rstd.data(), N,
                     C);
}

void GptModel::embedding_backward(float* emb_grads) {
  const UnitLayout& u = units_[0];
  float* dwte = tensor_in(emb_grads, u.tensor("wte"), ViewOf::kGrads);
  float* dwpe = tensor_in(emb_grads, u.tensor("wpe"), ViewOf::kGrads);
  if (dwte == nullptr && dwpe == nullptr) return;  // frozen (LoRA)
  ST_CHECK(dwte != nullptr && dwpe != nullptr, "wte and wpe are trained together or not at all");
  st::embedding_backward(dwte, dwpe, dresid_.data(), tokens_.data(), static_cast<int>(B_), static_cast<int>(T_),
                         cfg_.n_embd);
}

}  // namespace st
