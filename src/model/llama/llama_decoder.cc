#include "shardtrain/model/llama/llama_decoder.h"

#include "shardtrain/kernels/decode_attention.h"
#include "shardtrain/kernels/embedding.h"
#include "shardtrain/kernels/matmul.h"
#include "shardtrain/kernels/rmsnorm.h"
#include "shardtrain/kernels/swiglu.h"
#include "shardtrain/model/llama/block_view.h"

namespace st {

LlamaDecoder::LlamaDecoder(const ModelConfig& cfg, int max_batch)
    : CpuDecoderBase(cfg, max_batch), rope_(rope_table(cfg, cfg.seq_len)) {}

void LlamaDecoder::forward(const int32_t* tokens, int64_t n, int64_t pos, std::vector<float>* logits) {
  const ModelConfig& cfg = config();
  const int C = cfg.n_embd, H = cfg.n_head, KV = cfg.kv_heads(), D = cfg.head_dim(), QKV = cfg.qkv_dim(),
            F = cfg.mlp_dim();
  const float eps = cfg.rms_norm_eps;
  x_.resize(n * C);
  norm_.resize(n * C);
  rstd_.resize(n);
  qkv_.resize(n * QKV);
  att_.resize(n * C);
  gate_up_.resize(n * 2 * F);
  mlp_.resize(n * F);
  const float* embed = unit(0) + units_[0].tensor("embed_tokens").offset;
  embedding_forward(x_.data(), tokens, embed, nullptr, 1, static_cast<int>(n), C);
  // Rows pos .. of the [seq_len, hs/2] tables: the rotation of each new position.
  const float* cos = rope_.cos.data() + pos * rope_.half;
  const float* sin = rope_.sin.data() + pos * rope_.half;
  for (int l = 0; l < cfg.n_layer; ++l) {
    const LlamaBlockView<const float> p(unit(1 + l), units_[static_cast<size_t>(1 + l)]);
    rmsnorm_forward(norm_.data(), rstd_.data(), x_.data(), p.attn_norm, eps, n, C);
    matmul_forward(qkv_.data(), norm_.data(), p.qkvw, p.qkvb, n, C, QKV);
    rope_forward(qkv_.data(), cos, sin, 1, n, H, KV, D);
    cache().append(l, qkv_.data(), n, pos);
    decode_attention(att_.data(), qkv_.data(), QKV, cache().keys(l), cache().values(l), static_cast<int>(n),
                     static_cast<int>(pos), H, KV, D);
    matmul_forward_residual(x_.data(), att_.data(), p.ow, nullptr, x_.data(), n, C, C);
    rmsnorm_forward(norm_.data(), rstd_.data(), x_.data(), p.mlp_norm, eps, n, C);
    matmul_forward(gate_up_.data(), norm_.data(), p.gate_up, nullptr, n, C, 2 * F);
    swiglu_forward(mlp_.data(), gate_up_.data(), n, F);
    matmul_forward_residual(x_.data(), mlp_.data(), p.down, nullptr, x_.data(), n, F, C);
  }
  // The final RMSNorm and the classifier (embed_tokens when tied, else lm_head) on the last position only.
  const UnitLayout& hu = units_.back();
  const float* head = unit(cfg.n_layer + 1);
  rmsnorm_forward(norm_.data(), rstd_.data(), x_.data() + (n - 1) * C, head + hu.tensor("norm.weight").offset, eps, 1,
                  C);
  const float* classifier = cfg.tie_embeddings ? embed : head + hu.tensor("lm_head").offset;
  logits->assign(static_cast<size_t>(cfg.padded_vocab()), 0.0f);
  matmul_forward(logits->data(), norm_.data(), classifier, nullptr, 1, C, cfg.padded_vocab());
  logits->resize(static_cast<size_t>(cfg.vocab_size));
}

}  // namespace st
