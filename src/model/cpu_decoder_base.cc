#include "shardtrain/model/cpu_decoder_base.h"

#include <algorithm>

namespace st {

CpuDecoderBase::CpuDecoderBase(const ModelConfig& cfg, int max_batch, const DecoderStage& stage)
    : Decoder(cfg, max_batch, stage),
      units_(build_units(cfg)),
      caches_(static_cast<size_t>(max_batch), KvCache(cfg, stage_layers(cfg, stage))),
      w_(units_.size()) {}

void CpuDecoderBase::forward(const int32_t* tokens, int64_t n, int64_t pos, std::vector<float>* logits) {
  const int64_t C = config().n_embd;
  x_.resize(static_cast<size_t>(n * C));
  if (stage().first())
    embed(tokens, n, pos, x_.data());
  else
    receive_rows(x_.data(), static_cast<int64_t>(sizeof(float) * x_.size()));
  for (int l = layers().first; l < layers().end; ++l) block(l, x_.data(), n, pos);
  if (!stage().last()) return send_rows(x_.data(), static_cast<int64_t>(sizeof(float) * x_.size()));
  logits->assign(static_cast<size_t>(config().padded_vocab()), 0.0f);
  head(x_.data() + (n - 1) * C, logits->data());
  logits->resize(static_cast<size_t>(config().vocab_size));
}

void CpuDecoderBase::forward_batch(const int32_t* tokens, const int32_t* positions, int n, std::vector<float>* logits) {
  if (!stage().split()) return Decoder::forward_batch(tokens, positions, n, logits);
  const int64_t C = config().n_embd;
  const auto V = static_cast<size_t>(config().vocab_size), Vp = static_cast<size_t>(config().padded_vocab());
  x_.assign(static_cast<size_t>(n * C), 0.0f);  // an idle row's stay zero
  float* x = x_.data();
  const auto bytes = static_cast<int64_t>(sizeof(float) * x_.size());
  if (stage().first()) {
    for (int r = 0; r < n; ++r)
      if (positions[r] >= 0) embed(tokens + r, 1, positions[r], x + r * C);
  } else {
    receive_rows(x, bytes);
  }
  for (int r = 0; r < n; ++r) {
    if (positions[r] < 0) continue;
    use_sequence(r);
    for (int l = layers().first; l < layers().end; ++l) block(l, x + r * C, 1, positions[r]);
  }
  if (!stage().last()) return send_rows(x, bytes);
  logits->assign(static_cast<size_t>(n) * V, 0.0f);
  std::vector<float> row(Vp);
  for (int r = 0; r < n; ++r) {
    if (positions[r] < 0) continue;
    std::fill(row.begin(), row.end(), 0.0f);
    head(x + r * C, row.data());
    std::copy(row.begin(), row.begin() + static_cast<ptrdiff_t>(V), logits->begin() + static_cast<ptrdiff_t>(r * V));
  }
}

}  // namespace st
