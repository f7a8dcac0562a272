#include "shardtrain/model/decoder.h"

#include "shardtrain/core/error.h"
#include "shardtrain/model/family.h"
#include "shardtrain/model/sampling.h"
#include "shardtrain/model/units.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/model/cuda_decoder.h"
#endif

namespace st {

Decoder::Decoder(const ModelConfig& cfg) : cfg_(cfg), layout_(build_units(cfg)), loaded_(layout_.size(), false) {}

void Decoder::load_unit(int u, std::vector<float>& values) {
  if (u < 0 || u >= static_cast<int>(loaded_.size()))
    ST_BAD_INPUT("a decoder of ", loaded_.size(), " units was given weights for unit ", u);
  const UnitLayout& unit = layout_[static_cast<size_t>(u)];
  if (loaded_[static_cast<size_t>(u)]) ST_BAD_INPUT("unit ", unit.name, "'s weights were given to the decoder twice");
  if (static_cast<int64_t>(values.size()) != unit.numel)
    ST_BAD_INPUT("unit ", unit.name, " has ", values.size(), " weights, expected ", unit.numel);
  store_unit(u, values);
  loaded_[static_cast<size_t>(u)] = true;
  ++units_loaded_;
}

void Decoder::check_tokens(const int32_t* tokens, int64_t n) const {
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
      ST_BAD_INPUT("token ", tokens[i], " (at position ", position_ + i, ") is outside the vocabulary [0, ",
                   cfg_.vocab_size, ")");
}

const std::vector<float>& Decoder::prefill(const std::vector<int32_t>& tokens) {
  const auto n = static_cast<int64_t>(tokens.size());
  ST_CHECK(loaded(), "a decoder runs once every unit's weights are loaded (", units_loaded_, " of ", loaded_.size(),
           " are)");
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

int32_t Decoder::step_greedy(int32_t token) {
  ST_CHECK(!full(), "the KV cache is full: its ", max_length(),
           " positions (model.seq_len) hold tokens; prefill again with a shorter context to continue");
  check_tokens(&token, 1);
  const int32_t next = forward_greedy(token, position_);
  ++position_;
  return next;
}

int32_t Decoder::forward_greedy(int32_t token, int64_t pos) {
  forward(&token, 1, pos, &logits_);
  return sample_token(logits_, SamplingOptions{0.0, 0, 0}, 0);  // greedy, refusing a non-finite logit
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

std::unique_ptr<Decoder> load_decoder(std::unique_ptr<Decoder> d, std::vector<std::vector<float>> weights) {
  check_decoder_weights(d->config(), weights);
  for (size_t u = 0; u < weights.size(); ++u) {
    d->load_unit(static_cast<int>(u), weights[u]);
    std::vector<float>().swap(weights[u]);  // a GPU decoder has its copy: the host's goes at once
  }
  return d;
}

std::unique_ptr<Decoder> make_decoder(const Config& cfg, std::vector<std::vector<float>> weights, int cuda_device) {
  return load_decoder(make_unloaded_decoder(cfg, cuda_device), std::move(weights));
}

std::unique_ptr<Decoder> make_unloaded_decoder(const Config& cfg, int cuda_device) {
  if (cfg.train.device == Device::kCpu) return model_family(cfg.model.arch).make_cpu_decoder(cfg.model);
#ifdef SHARDTRAIN_HAVE_CUDA
  return make_cuda_decoder(cfg.model, cfg.compute_dtype(), cuda_device);
#else
  ST_BAD_INPUT(
      "train.device = cuda, but this shardtrain was built without the CUDA backend (nvcc was not found "
      "at configure time, or -DSHARDTRAIN_CUDA=OFF); use train.device = cpu or rebuild with CUDA");
#endif
}

}  // namespace st
