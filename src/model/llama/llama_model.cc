#include "shardtrain/model/llama/llama_model.h"

#include <algorithm>
#include <cstring>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/attention.h"
#include "shardtrain/kernels/embedding.h"
#include "shardtrain/kernels/matmul.h"
#include "shardtrain/kernels/rmsnorm.h"
#include "shardtrain/kernels/swiglu.h"
#include "shardtrain/model/classifier.h"
#include "shardtrain/model/llama/block_view.h"

namespace st {
namespace {

void zero(std::vector<float>& v, int64_t n) { std::memset(v.data(), 0, sizeof(float) * static_cast<size_t>(n)); }

// Every buffer's element count, from the config alone: the constructor allocates exactly these, and
// footprint_bytes sums them.
struct Sizes {
  int64_t blocks, BT, C, QKV, F, att, chunk, rope;
  Sizes(const ModelConfig& cfg, int64_t max_batch, Recompute recompute)
      : blocks(recompute.sets(cfg.n_layer)),
        BT(max_batch * cfg.seq_len),
        C(cfg.n_embd),
        QKV(cfg.qkv_dim()),
        F(cfg.mlp_dim()),
        att(max_batch * cfg.n_head * int64_t{cfg.seq_len} * cfg.seq_len),
        chunk(classifier_chunk_rows(BT, cfg.padded_vocab()) * cfg.padded_vocab()),
        rope(int64_t{cfg.seq_len} * cfg.head_dim()) {}  // cos and sin, [T, hs/2] each
  // norm1, atty, res2, norm2 (BT x C); two BT statistics; qkv; gate_up; mlp; att.
  int64_t per_block() const { return 4 * BT * C + 2 * BT + BT * QKV + 2 * BT * F + BT * F + att; }
  int64_t floats(int n_layer) const {
    return blocks * per_block() + n_layer * BT * C                // block outputs
           + BT * C + BT * C + 2 * BT                             // encoded; normf and its statistics, losses
           + 3 * BT * C + BT * QKV + BT * F + 2 * BT * F + chunk  // dresid, dnormf, dbuf_c; dqkv; dmlp; dgate_up
           + rope;
  }
};

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& cfg, int64_t max_batch, Recompute recompute)
    : cfg_(cfg),
      units_(build_units(cfg)),
      max_batch_(max_batch),
      recompute_(recompute),
      rope_(rope_table(cfg, cfg.seq_len)),
      lora_(cfg, units_, max_batch * cfg.seq_len, recompute) {
  ST_CHECK(max_batch > 0 && cfg.is_llama());
  const Sizes z(cfg, max_batch, recompute);
  tokens_.resize(z.BT);
  encoded_.resize(z.BT * z.C);
  blocks_.resize(z.blocks);
  block_out_.assign(cfg.n_layer, std::vector<float>(z.BT * z.C));
  for (BlockActs& a : blocks_) {
    for (std::vector<float>* v : {&a.norm1, &a.atty, &a.res2, &a.norm2}) v->resize(z.BT * z.C);
    a.rstd1.resize(z.BT);
    a.rstd2.resize(z.BT);
    a.qkv.resize(z.BT * z.QKV);
    a.att.resize(z.att);
    a.gate_up.resize(z.BT * 2 * z.F);
    a.mlp.resize(z.BT * z.F);
  }
  normf_.resize(z.BT * z.C);
  rstdf_.resize(z.BT);
  losses_.resize(z.BT);
  dresid_.resize(z.BT * z.C);
  dnormf_.resize(z.BT * z.C);
  dbuf_c_.resize(z.BT * z.C);
  dqkv_.resize(z.BT * z.QKV);
  dmlp_.resize(z.BT * z.F);
  dgate_up_.resize(z.BT * 2 * z.F);
  logits_chunk_.resize(z.chunk);
}

int64_t LlamaModel::footprint_bytes(const ModelConfig& cfg, int64_t max_batch, Recompute recompute) {
  const Sizes z(cfg, max_batch, recompute);
  return (z.floats(cfg.n_layer) + CpuLora::footprint_floats(cfg, z.BT, z.blocks)) *
             static_cast<int64_t>(sizeof(float)) +
         z.BT * static_cast<int64_t>(sizeof(int32_t));  // + tokens
}

int64_t LlamaModel::allocated_bytes() const {
  auto bytes = [](const auto& v) { return static_cast<int64_t>(v.size() * sizeof(v[0])); };
  int64_t n = bytes(tokens_) + bytes(encoded_) + bytes(normf_) + bytes(rstdf_) + bytes(losses_) + bytes(dresid_) +
              bytes(dnormf_) + bytes(dbuf_c_) + bytes(dqkv_) + bytes(dmlp_) + bytes(dgate_up_) + bytes(logits_chunk_) +
              bytes(rope_.cos) + bytes(rope_.sin) + lora_.allocated_floats() * static_cast<int64_t>(sizeof(float));
  for (const std::vector<float>& o : block_out_) n += bytes(o);
  for (const BlockActs& a : blocks_)
    for (const std::vector<float>* v :
         {&a.norm1, &a.rstd1, &a.qkv, &a.att, &a.atty, &a.res2, &a.norm2, &a.rstd2, &a.gate_up, &a.mlp})
      n += bytes(*v);
  return n;
}

const float* LlamaModel::block_input(int layer) const {
  return layer == 0 ? encoded_.data() : block_out_[layer - 1].data();
}

const float* LlamaModel::classifier(const float* head_params, const float* emb_params) const {
  return cfg_.tie_embeddings ? emb_params + units_.front().tensor("embed_tokens").offset
                             : head_params + units_.back().tensor("lm_head").offset;
}

void LlamaModel::embedding_forward(const float* emb_params, const int32_t* tokens, int64_t B, int64_t t) {
  ST_CHECK(B >= 1 && B <= max_batch_ && t >= 1 && t <= cfg_.seq_len, "shape [", B, ", ", t, "] exceeds [", max_batch_,
           ", ", cfg_.seq_len, "]");
  B_ = B;
  T_ = t;
  lora_.set_batch(dropout_seed_, first_sequence_, t);
  std::copy(tokens, tokens + B * t, tokens_.begin());
  st::embedding_forward(encoded_.data(), tokens_.data(), emb_params, nullptr, static_cast<int>(B), static_cast<int>(t),
                        cfg_.n_embd);
}

void LlamaModel::block_forward(int layer, const float* block_params) {
  const LlamaBlockView<const float> p(block_params, units_[1 + layer]);
  BlockActs& a = acts(layer);
  float* out = block_out_[layer].data();
  const int64_t N = B_ * T_;
  const int C = cfg_.n_embd, H = cfg_.n_head, KV = cfg_.kv_heads(), D = cfg_.head_dim(), QKV = cfg_.qkv_dim(),
            F = cfg_.mlp_dim();
  const float* x = block_input(layer);
  rmsnorm_forward(a.norm1.data(), a.rstd1.data(), x, p.attn_norm, cfg_.rms_norm_eps, N, C);
  linear_.forward(a.qkv.data(), a.norm1.data(), p.qkvw, p.qkvb, nullptr, N, C, QKV, {layer, "attn.qkv.weight"});
  lora_.forward(layer, "attn.qkv.weight", block_params, a.qkv.data(), QKV, a.norm1.data(), N);
  rope_forward(a.qkv.data(), rope_.cos.data(), rope_.sin.data(), B_, T_, H, KV, D);
  attention_forward(a.atty.data(), a.att.data(), a.qkv.data(), static_cast<int>(B_), static_cast<int>(T_), H, KV, D);
  linear_.forward(a.res2.data(), a.atty.data(), p.ow, nullptr, x, N, C, C, {layer, "attn.o.weight"});
  lora_.forward(layer, "attn.o.weight", block_params, a.res2.data(), C, a.atty.data(), N);
  rmsnorm_forward(a.norm2.data(), a.rstd2.data(), a.res2.data(), p.mlp_norm, cfg_.rms_norm_eps, N, C);
  linear_.forward(a.gate_up.data(), a.norm2.data(), p.gate_up, nullptr, nullptr, N, C, 2 * F,
                  {layer, "mlp.gate_up.weight"});
  lora_.forward(layer, "mlp.gate_up.weight", block_params, a.gate_up.data(), 2 * F, a.norm2.data(), N);
  swiglu_forward(a.mlp.data(), a.gate_up.data(), N, F);
  linear_.forward(out, a.mlp.data(), p.down, nullptr, a.res2.data(), N, F, C, {layer, "mlp.down.weight"});
  lora_.forward(layer, "mlp.down.weight", block_params, out, C, a.mlp.data(), N);
}

double LlamaModel::head_forward_backward(const float* head_params, const float* emb_params, const int32_t* targets,
                                         float dloss, float* head_grads, float* emb_grads) {
  return head_pass(head_params, emb_params, targets, dloss, head_grads, emb_grads, true);
}

double LlamaModel::head_forward(const float* head_params, const float* emb_params, const int32_t* targets) {
  return head_pass(head_params, emb_params, targets, 0.0f, nullptr, nullptr, false);
}

double LlamaModel::head_pass(const float* head_params, const float* emb_params, const int32_t* targets, float dloss,
                             float* head_grads, float* emb_grads, bool backward) {
  const UnitLayout& hu = units_.back();
  const int64_t N = B_ * T_;
  const int C = cfg_.n_embd, V = cfg_.vocab_size, Vp = cfg_.padded_vocab();
  const float* x = cfg_.n_layer > 0 ? block_out_.back().data() : encoded_.data();
  const float* normw = head_params + hu.tensor("norm.weight").offset;
  const float* w = classifier(head_params, emb_params);
  float* dw = nullptr;
  if (backward)
    dw = cfg_.tie_embeddings ? tensor_in(emb_grads, units_.front().tensor("embed_tokens"), ViewOf::kGrads)
                             : tensor_in(head_grads, hu.tensor("lm_head"), ViewOf::kGrads);
  rmsnorm_forward(normf_.data(), rstdf_.data(), x, normw, cfg_.rms_norm_eps, N, C);
  if (backward) zero(dnormf_, N * C);

  const double loss_sum = chunked_classifier(normf_.data(), w, targets, N, C, V, Vp, dloss, logits_chunk_.data(),
                                             losses_.data(), backward ? dnormf_.data() : nullptr, dw);
  if (backward) {
    zero(dresid_, N * C);
    rmsnorm_backward(dresid_.data(), tensor_in(head_grads, hu.tensor("norm.weight"), ViewOf::kGrads), dnormf_.data(), x,
                     normw, rstdf_.data(), N, C);
  }
  return loss_sum;
}

void LlamaModel::head_logits(const float* head_params, const float* emb_params, int64_t pos,
                             std::vector<float>* logits) {
  ST_CHECK(pos >= 0 && pos < T_, "position ", pos, " outside the active length ", T_);
  const int C = cfg_.n_embd, Vp = cfg_.padded_vocab();
  const float* x = (cfg_.n_layer > 0 ? block_out_.back().data() : encoded_.data()) + pos * C;
  float rstd = 0;
  std::vector<float> row(C);
  rmsnorm_forward(row.data(), &rstd, x, head_params + units_.back().tensor("norm.weight").offset, cfg_.rms_norm_eps, 1,
                  C);
  logits->assign(Vp, 0.0f);
  matmul_forward(logits->data(), row.data(), classifier(head_params, emb_params), nullptr, 1, C, Vp);
  logits->resize(cfg_.vocab_size);
}

void LlamaModel::block_backward(int layer, const float* block_params, float* block_grads) {
  if (recompute_.of(layer)) block_forward(layer, block_params);  // refills the shared activations from its input
  const LlamaBlockView<const float> p(block_params, units_[1 + layer]);
  const LlamaBlockView<float> g(block_grads, units_[1 + layer], ViewOf::kGrads);
  BlockActs& a = acts(layer);
  const int64_t N = B_ * T_;
  const int C = cfg_.n_embd, H = cfg_.n_head, KV = cfg_.kv_heads(), D = cfg_.head_dim(), QKV = cfg_.qkv_dim(),
            F = cfg_.mlp_dim();
  const float* x = block_input(layer);

  // MLP branch: dresid is d(out); the residual passes it to res2 unchanged.
  linear_.backward(dmlp_.data(), g.down, nullptr, dresid_.data(), a.mlp.data(), p.down, N, F, C, GradWrite::kOverwrite,
                   GradWrite::kAccumulate, {layer, "mlp.down.weight"});
  lora_.backward(layer, "mlp.down.weight", block_params, block_grads, dmlp_.data(), dresid_.data(), C, a.mlp.data(), N);
  swiglu_backward(dgate_up_.data(), dmlp_.data(), a.gate_up.data(), N, F);
  linear_.backward(dbuf_c_.data(), g.gate_up, nullptr, dgate_up_.data(), a.norm2.data(), p.gate_up, N, C, 2 * F,
                   GradWrite::kOverwrite, GradWrite::kAccumulate, {layer, "mlp.gate_up.weight"});
  lora_.backward(layer, "mlp.gate_up.weight", block_params, block_grads, dbuf_c_.data(), dgate_up_.data(), 2 * F,
                 a.norm2.data(), N);
  rmsnorm_backward(dresid_.data(), g.mlp_norm, dbuf_c_.data(), a.res2.data(), p.mlp_norm, a.rstd2.data(), N, C);

  // Attention branch: dresid is now d(res2); the residual passes it to x unchanged.
  linear_.backward(dbuf_c_.data(), g.ow, nullptr, dresid_.data(), a.atty.data(), p.ow, N, C, C, GradWrite::kOverwrite,
                   GradWrite::kAccumulate, {layer, "attn.o.weight"});
  lora_.backward(layer, "attn.o.weight", block_params, block_grads, dbuf_c_.data(), dresid_.data(), C, a.atty.data(),
                 N);
  zero(dqkv_, N * QKV);
  attention_backward(dqkv_.data(), dbuf_c_.data(), a.qkv.data(), a.att.data(), static_cast<int>(B_),
                     static_cast<int>(T_), H, KV, D);
  rope_backward(dqkv_.data(), rope_.cos.data(), rope_.sin.data(), B_, T_, H, KV, D);
  linear_.backward(dbuf_c_.data(), g.qkvw, g.qkvb, dqkv_.data(), a.norm1.data(), p.qkvw, N, C, QKV,
                   GradWrite::kOverwrite, GradWrite::kAccumulate, {layer, "attn.qkv.weight"});
  lora_.backward(layer, "attn.qkv.weight", block_params, block_grads, dbuf_c_.data(), dqkv_.data(), QKV, a.norm1.data(),
                 N);
  rmsnorm_backward(dresid_.data(), g.attn_norm, dbuf_c_.data(), x, p.attn_norm, a.rstd1.data(), N, C);
}

void LlamaModel::embedding_backward(float* emb_grads) {
  float* dwte = tensor_in(emb_grads, units_.front().tensor("embed_tokens"), ViewOf::kGrads);
  if (dwte == nullptr) return;  // frozen (LoRA)
  st::embedding_backward(dwte, nullptr, dresid_.data(), tokens_.data(), static_cast<int>(B_), static_cast<int>(T_),
                         cfg_.n_embd);
}

}  // namespace st
