#include "shardtrain/model/llama/llama_decoder.h"

#include "shardtrain/kernels/decode_attention.h"
#include "shardtrain/kernels/embedding.h"
#include "shardtrain/kernels/matmul.h"
#include "shardtrain/kernels/rmsnorm.h"
#include "shardtrain/model/llama/block_view.h"

namespace st {

LlamaDecoder::LlamaDecoder(const ModelConfig& cfg, int max_batch, const DecoderStage& stage)
    : CpuDecoderBase(cfg, max_batch, stage), rope_(rope_table(cfg, cfg.seq_len)) {}

void LlamaDecoder::embed(const int32_t* tokens, int64_t n, int64_t pos, float* x) {
  embedding_forward(x, tokens, unit(0) + units_[0].tensor("embed_tokens").offset, nullptr, 1, static_cast<int>(n),
                    config().n_embd);
}

void LlamaDecoder::block(int layer, float* x, int64_t n, int64_t pos) {
  const ModelConfig& cfg = config();
  const int C = cfg.n_embd, H = cfg.n_head, KV = cfg.kv_heads(), D = cfg.head_dim(), QKV = cfg.qkv_dim(),
            F = cfg.mlp_dim();
  const float eps = cfg.rms_norm_eps;
  norm_.resize(n * C);
  rstd_.resize(n);
  qkv_.resize(n * QKV);
  att_.resize(n * C);
  gate_up_.resize(n * 2 * F);
  mlp_.resize(n * F);
  // Rows pos .. of the [seq_len, hs/2] tables: the rotation of each new position.
  const float* cos = rope_.cos.data() + pos * rope_.half;
  const float* sin = rope_.sin.data() + pos * rope_.half;
  const LlamaBlockView<const float> p(unit(1 + layer), units_[static_cast<size_t>(1 + layer)]);
  rmsnorm_forward(norm_.data(), rstd_.data(), x, p.attn_norm, eps, n, C);
  matmul_forward(qkv_.data(), norm_.data(), p.qkvw, p.qkvb, n, C, QKV);
  rope_forward(qkv_.data(), cos, sin, 1, n, H, KV, D);
  cache().append(layer, qkv_.data(), n, pos);
  decode_attention(att_.data(), qkv_.data(), QKV, cache().keys(layer), cache().values(layer), static_cast<int>(n),
                   static_cast<int>(pos), H, KV, D);
  matmul_forward_residual(x, att_.data(), p.ow, nullptr, x, n, C, C);
  rmsnorm_forward(norm_.data(), rstd_.data(), x, p.mlp_norm, eps, n, C);
  matmul_forward(gate_up_.data(), norm_.data(), p.gate_up, nullptr, n, C, 2 * F);
  swiglu_matmul_forward_residual(x, mlp_.data(), gate_up_.data(), p.down, nullptr, x, n, F, C);
}

void LlamaDecoder::head(const float* x, float* logits) {
  // The final RMSNorm and the classifier (embed_tokens when tied, else lm_head).
  const ModelConfig& cfg = config();
  const int C = cfg.n_embd;
  norm_.resize(C);
  rstd_.resize(1);
  const UnitLayout& hu = units_.back();
  const float* h = unit(cfg.n_layer + 1);
  rmsnorm_forward(norm_.data(), rstd_.data(), x, h + hu.tensor("norm.weight").offset, cfg.rms_norm_eps, 1, C);
  const float* classifier =
      cfg.tie_embeddings ? unit(0) + units_[0].tensor("embed_tokens").offset : h + hu.tensor("lm_head").offset;
  matmul_forward(logits, norm_.data(), classifier, nullptr, 1, C, cfg.padded_vocab());
}

}  // namespace st
