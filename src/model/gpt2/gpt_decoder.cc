#include "shardtrain/model/gpt2/gpt_decoder.h"

#include "shardtrain/kernels/decode_attention.h"
#include "shardtrain/kernels/embedding.h"
#include "shardtrain/kernels/gelu.h"
#include "shardtrain/kernels/layernorm.h"
#include "shardtrain/kernels/matmul.h"
#include "shardtrain/model/gpt2/block_view.h"

namespace st {

GptDecoder::GptDecoder(const ModelConfig& cfg, int max_batch, const DecoderStage& stage)
    : CpuDecoderBase(cfg, max_batch, stage) {}

void GptDecoder::embed(const int32_t* tokens, int64_t n, int64_t pos, float* x) {
  const int C = config().n_embd;
  const UnitLayout& eu = units_[0];
  embedding_forward(x, tokens, unit(0) + eu.tensors[0].offset, unit(0) + eu.tensors[1].offset + pos * C, 1,
                    static_cast<int>(n), C);
}

void GptDecoder::block(int layer, float* x, int64_t n, int64_t pos) {
  const ModelConfig& cfg = config();
  const int C = cfg.n_embd, NH = cfg.n_head, hs = cfg.head_dim();
  norm_.resize(n * C);
  mean_.resize(n);
  rstd_.resize(n);
  qkv_.resize(n * 3 * C);
  att_.resize(n * C);
  fch_.resize(n * 4 * C);
  fch_gelu_.resize(n * 4 * C);
  const BlockView<const float> p(unit(1 + layer), units_[static_cast<size_t>(1 + layer)]);
  layernorm_forward(norm_.data(), mean_.data(), rstd_.data(), x, p.ln1w, p.ln1b, n, C);
  matmul_forward(qkv_.data(), norm_.data(), p.qkvw, p.qkvb, n, C, 3 * C);
  cache().append(layer, qkv_.data(), n, pos);
  decode_attention(att_.data(), qkv_.data(), 3 * C, cache().keys(layer), cache().values(layer), static_cast<int>(n),
                   static_cast<int>(pos), NH, NH, hs);
  matmul_forward_residual(x, att_.data(), p.projw, p.projb, x, n, C, C);
  layernorm_forward(norm_.data(), mean_.data(), rstd_.data(), x, p.ln2w, p.ln2b, n, C);
  matmul_forward(fch_.data(), norm_.data(), p.fcw, p.fcb, n, C, 4 * C);
  gelu_forward(fch_gelu_.data(), fch_.data(), n * 4 * C);
  matmul_forward_residual(x, fch_gelu_.data(), p.fcprojw, p.fcprojb, x, n, 4 * C, C);
}

void GptDecoder::head(const float* x, float* logits) {
  // The final LayerNorm and the classifier (wte, tied).
  const ModelConfig& cfg = config();
  const int C = cfg.n_embd;
  norm_.resize(C);
  mean_.resize(1);
  rstd_.resize(1);
  const UnitLayout& hu = units_.back();
  const float* h = unit(cfg.n_layer + 1);
  layernorm_forward(norm_.data(), mean_.data(), rstd_.data(), x, h + hu.tensors[0].offset, h + hu.tensors[1].offset, 1,
                    C);
  matmul_forward(logits, norm_.data(), unit(0) + units_[0].tensors[0].offset, nullptr, 1, C, cfg.padded_vocab());
}

}  // namespace st
