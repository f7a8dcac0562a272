#include "shardtrain/model/decoder.h"

#include "shardtrain/core/error.h"
#include "shardtrain/model/family.h"
#include "shardtrain/model/units.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/model/cuda_decoder.h"
#endif

namespace st {

Decoder::Decoder(const ModelConfig& cfg) : cfg_(cfg) {}

void Decoder::check_tokens(const int32_t* tokens, int64_t n) const {
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
      ST_BAD_INPUT("token ", tokens[i], " (at position ", position_ + i, ") is outside the vocabulary [0, ",
                   cfg_.vocab_size, ")");
}

const std::vector<float>& Decoder::prefill(const std::vector<int32_t>& tokens) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (n < 1 || n > max_length())
    ST_BAD_INPUT("a prompt of ", n, " tokens: the model reads 1 to ", max_length(), " (model.seq_len)");
  position_ = 0;
  check_tokens(tokens.data(), n);
  forward(tokens.data(), n, 0, &logits_);
  position_ = n;
  return logits_;
}

const std::vector<float>& Decoder::step(int32_t token) {
  ST_CHECK(!full(), "the KV cache is full: its ", max_length(),
           " positions (model.seq_len) hold tokens; prefill again with a shorter context to continue");
  check_tokens(&token, 1);
  forward(&token, 1, position_, &logits_);
  ++position_;
  return logits_;
}

void check_decoder_weights(const ModelConfig& cfg, const std::vector<std::vector<float>>& weights) {
  const std::vector<UnitLayout> units = build_units(cfg);
  if (weights.size() != units.size())
    ST_BAD_INPUT("a decoder needs the weights of ", units.size(), " units, got ", weights.size());
  for (const UnitLayout& u : units)
    if (static_cast<int64_t>(weights[static_cast<size_t>(u.index)].size()) != u.numel)
      ST_BAD_INPUT("unit ", u.name, " has ", weights[static_cast<size_t>(u.index)].size(), " weights, expected ",
                   u.numel);
}

std::unique_ptr<Decoder> make_decoder(const Config& cfg, std::vector<std::vector<float>> weights, int cuda_device) {
  if (cfg.train.device == Device::kCpu)
    return model_family(cfg.model.arch).make_cpu_decoder(cfg.model, std::move(weights));
#ifdef SHARDTRAIN_HAVE_CUDA
  return make_cuda_decoder(cfg.model, cfg.compute_dtype(), weights, cuda_device);
#else
  ST_BAD_INPUT(
      "train.device = cuda, but this shardtrain was built without the CUDA backend (nvcc was not found "
      "at configure time, or -DSHARDTRAIN_CUDA=OFF); use train.device = cpu or rebuild with CUDA");
#endif
}

}  // namespace st
