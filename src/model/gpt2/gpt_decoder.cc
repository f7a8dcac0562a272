#include "shardtrain/model/gpt2/gpt_decoder.h"

#include "shardtrain/kernels/decode_attention.h"
#include "shardtrain/kernels/embedding.h"
#include "shardtrain/kernels/gelu.h"
#include "shardtrain/kernels/layernorm.h"
#include "shardtrain/kernels/matmul.h"
#include "shardtrain/model/gpt2/block_view.h"

namespace st {

GptDecoder::GptDecoder(const ModelConfig& cfg, int max_batch) : CpuDecoderBase(cfg, max_batch) {}

void GptDecoder::forward(const int32_t* tokens, int64_t n, int64_t pos, std::vector<float>* logits) {
  const ModelConfig& cfg = config();
  const int C = cfg.n_embd, NH = cfg.n_head, hs = cfg.head_dim();
  x_.resize(n * C);
  norm_.resize(n * C);
  mean_.resize(n);
  rstd_.resize(n);
  qkv_.resize(n * 3 * C);
  att_.resize(n * C);
  fch_.resize(n * 4 * C);
  fch_gelu_.resize(n * 4 * C);
  const UnitLayout& eu = units_[0];
  const float* wte = unit(0) + eu.tensors[0].offset;
  embedding_forward(x_.data(), tokens, wte, unit(0) + eu.tensors[1].offset + pos * C, 1, static_cast<int>(n), C);
  for (int l = 0; l < cfg.n_layer; ++l) {
    const BlockView<const float> p(unit(1 + l), units_[static_cast<size_t>(1 + l)]);
    layernorm_forward(norm_.data(), mean_.data(), rstd_.data(), x_.data(), p.ln1w, p.ln1b, n, C);
    matmul_forward(qkv_.data(), norm_.data(), p.qkvw, p.qkvb, n, C, 3 * C);
    cache().append(l, qkv_.data(), n, pos);
    decode_attention(att_.data(), qkv_.data(), 3 * C, cache().keys(l), cache().values(l), static_cast<int>(n),
                     static_cast<int>(pos), NH, NH, hs);
    matmul_forward_residual(x_.data(), att_.data(), p.projw, p.projb, x_.data(), n, C, C);
    layernorm_forward(norm_.data(), mean_.data(), rstd_.data(), x_.data(), p.ln2w, p.ln2b, n, C);
    matmul_forward(fch_.data(), norm_.data(), p.fcw, p.fcb, n, C, 4 * C);
    gelu_forward(fch_gelu_.data(), fch_.data(), n * 4 * C);
    matmul_forward_residual(x_.data(), fch_gelu_.data(), p.fcprojw, p.fcprojb, x_.data(), n, 4 * C, C);
  }
  // The final LayerNorm and the classifier (wte, tied) on the last position only.
  const UnitLayout& hu = units_.back();
  const float* head = unit(cfg.n_layer + 1);
  layernorm_forward(norm_.data(), mean_.data(), rstd_.data(), x_.data() + (n - 1) * C, head + hu.tensors[0].offset,
                    head + hu.tensors[1].offset, 1, C);
  logits->assign(static_cast<size_t>(cfg.padded_vocab()), 0.0f);
  matmul_forward(logits->data(), norm_.data(), wte, nullptr, 1, C, cfg.padded_vocab());
  logits->resize(static_cast<size_t>(cfg.vocab_size));
}

}  // namespace st
