#include "shardtrain/model/decoder.h"

#include <algorithm>

#include "shardtrain/comm/communicator.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/kernels/adamw_host.h"
#include "shardtrain/kernels/scratch_sizes.h"
#include "shardtrain/model/family.h"
#include "shardtrain/model/sampling.h"
#include "shardtrain/model/units.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include "shardtrain/model/cuda_decoder.h"
#endif

namespace st {

Decoder::Decoder(const ModelConfig& cfg, int max_batch, const DecoderStage& stage)
    : cfg_(cfg),
      stage_(stage),
      layout_(build_units(cfg)),
      held_(st::held_units(cfg, stage)),
      loaded_(layout_.size(), false),
      units_held_(static_cast<int>(std::count(held_.begin(), held_.end(), true))),
      layers_(stage_layers(cfg, stage)) {
  if (max_batch < 1) ST_BAD_INPUT("a decoder holds at least one sequence, asked for ", max_batch);
  if (stage.split()) {
    const int units = static_cast<int>(layout_.size());
    ST_CHECK(stage.comm != nullptr && stage.comm->world_size() == stage.count && stage.comm->rank() == stage.index,
             "stage ", stage.index, " of ", stage.count, " needs a communicator of ", stage.count,
             " ranks in which it is rank ", stage.index);
    ST_CHECK(layers_.count() >= 1 && stage.units.first == (stage.first() ? 0 : layers_.first + 1) &&
                 stage.units.end == (stage.last() ? units : layers_.end + 1),
             "stage ", stage.index, " of ", stage.count, " holds units [", stage.units.first, ", ", stage.units.end,
             ") of ", units,
             ": a stage runs at least one block, the first starts at the embedding, the last ends at the head");
  }
  positions_.assign(static_cast<size_t>(max_batch), 0);
}

void Decoder::check_unit(int u, int64_t size) const {
  if (u < 0 || u >= static_cast<int>(loaded_.size()))
    ST_BAD_INPUT("a decoder of ", loaded_.size(), " units was given weights for unit ", u);
  const UnitLayout& unit = layout_[static_cast<size_t>(u)];
  if (!holds(u))
    ST_BAD_INPUT("unit ", unit.name, " belongs to another stage of the layer split: stage ", stage_.index,
                 " holds units [", stage_.units.first, ", ", stage_.units.end, ")");
  if (loaded_[static_cast<size_t>(u)]) ST_BAD_INPUT("unit ", unit.name, "'s weights were given to the decoder twice");
  if (size != unit.numel) ST_BAD_INPUT("unit ", unit.name, " has ", size, " weights, expected ", unit.numel);
}

void Decoder::load_unit(int u, std::vector<float>& values) {
  check_unit(u, static_cast<int64_t>(values.size()));
  store_unit(u, values);
  loaded_[static_cast<size_t>(u)] = true;
  ++units_loaded_;
}

void Decoder::load_unit_half(int u, const std::vector<uint16_t>& values, HalfKind kind) {
  ST_CHECK(kind == HalfKind::kBF16 || kind == HalfKind::kF16, "load_unit_half takes bf16 or fp16");
  check_unit(u, static_cast<int64_t>(values.size()));
  store_unit_half(u, values, kind);
  loaded_[static_cast<size_t>(u)] = true;
  ++units_loaded_;
}

void Decoder::store_unit_half(int u, const std::vector<uint16_t>& values, HalfKind kind) {
  std::vector<float> wide(values.size());
  const int64_t n = static_cast<int64_t>(values.size());
  constexpr int64_t kChunk = int64_t{1} << 20;
#pragma omp parallel for schedule(static)
  for (int64_t at = 0; at < n; at += kChunk)
    widen_half(values.data() + at, std::min(kChunk, n - at), kind, wide.data() + at);
  store_unit(u, wide);
}

void Decoder::check_tokens(const int32_t* tokens, int64_t n, int64_t pos) const {
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= cfg_.vocab_size)
      ST_BAD_INPUT("token ", tokens[i], " (at position ", pos + i, ") is outside the vocabulary [0, ", cfg_.vocab_size,
                   ")");
}

void Decoder::check_loaded() const {
  ST_CHECK(loaded(), "a decoder runs once every unit's weights are loaded (", units_loaded_, " of ", units_held_,
           " are)");
}

void Decoder::receive_rows(void* rows, int64_t bytes) { stage_.comm->recv(rows, bytes, stage_.index - 1); }

void Decoder::send_rows(const void* rows, int64_t bytes) { stage_.comm->send(rows, bytes, stage_.index + 1); }

void Decoder::share_logits(int64_t rows) {
  if (!stage_.split()) return;
  logits_.resize(static_cast<size_t>(rows * cfg_.vocab_size));
  stage_.comm->broadcast(logits_.data(), static_cast<int64_t>(sizeof(float) * logits_.size()), stage_.count - 1);
}

namespace {

void check_room(int64_t position, int64_t max_length, int seq) {
  ST_CHECK(position < max_length, "the KV cache of sequence ", seq, " is full: its ", max_length,
           " positions (model.seq_len) hold tokens; prefill again with a shorter context to continue");
}

}  // namespace

const std::vector<float>& Decoder::prefill(const std::vector<int32_t>& tokens, int seq) {
  const auto n = static_cast<int64_t>(tokens.size());
  check_loaded();
  ST_CHECK(seq >= 0 && seq < max_batch(), "sequence ", seq, " of a decoder of ", max_batch());
  if (n < 1 || n > max_length())
    ST_BAD_INPUT("a prompt of ", n, " tokens: the model reads 1 to ", max_length(), " (model.seq_len)");
  positions_[static_cast<size_t>(seq)] = 0;
  check_tokens(tokens.data(), n, 0);
  use_sequence(seq);
  forward(tokens.data(), n, 0, &logits_);
  share_logits(1);
  positions_[static_cast<size_t>(seq)] = n;
  return logits_;
}

const std::vector<float>& Decoder::step(int32_t token) {
  check_room(position(), max_length(), 0);
  check_tokens(&token, 1, position());
  use_sequence(0);
  forward(&token, 1, position(), &logits_);
  share_logits(1);
  ++positions_[0];
  return logits_;
}

std::vector<int32_t> Decoder::batch_positions(const std::vector<int32_t>& tokens, std::vector<int32_t>* ids) const {
  check_loaded();
  ST_CHECK(!tokens.empty() && tokens.size() <= positions_.size(), "a batched step of ", tokens.size(),
           " sequences for a decoder of ", positions_.size());
  std::vector<int32_t> at(tokens.size(), -1);
  ids->assign(tokens.size(), 0);  // an idle row runs token 0, whatever it gives
  for (size_t s = 0; s < tokens.size(); ++s) {
    if (tokens[s] == kIdle) continue;
    check_room(positions_[s], max_length(), static_cast<int>(s));
    check_tokens(&tokens[s], 1, positions_[s]);
    at[s] = static_cast<int32_t>(positions_[s]);
    (*ids)[s] = tokens[s];
  }
  return at;
}

const std::vector<float>& Decoder::step_batch(const std::vector<int32_t>& tokens) {
  std::vector<int32_t> ids;
  const std::vector<int32_t> at = batch_positions(tokens, &ids);
  forward_batch(ids.data(), at.data(), static_cast<int>(ids.size()), &logits_);
  share_logits(static_cast<int64_t>(ids.size()));
  for (size_t s = 0; s < tokens.size(); ++s) positions_[s] += at[s] >= 0 ? 1 : 0;
  return logits_;
}

std::vector<int32_t> Decoder::step_batch_next(const std::vector<int32_t>& tokens, const SamplingOptions& o,
                                              const std::vector<uint64_t>& draws) {
  check_sampling_options(o);
  ST_CHECK(draws.size() == tokens.size(), "a batched step of ", tokens.size(), " sequences with ", draws.size(),
           " draw indices");
  std::vector<int32_t> ids;
  const std::vector<int32_t> at = batch_positions(tokens, &ids);
  std::vector<int32_t> next(tokens.size());
  forward_batch_next(ids.data(), at.data(), static_cast<int>(ids.size()), o, draws.data(), next.data());
  if (stage_.split())
    stage_.comm->broadcast(next.data(), static_cast<int64_t>(sizeof(int32_t) * next.size()), stage_.count - 1);
  for (size_t s = 0; s < tokens.size(); ++s) {
    positions_[s] += at[s] >= 0 ? 1 : 0;
    if (at[s] < 0) next[s] = kIdle;
  }
  return next;
}

void Decoder::forward_batch(const int32_t* tokens, const int32_t* positions, int n, std::vector<float>* logits) {
  const auto V = static_cast<size_t>(cfg_.vocab_size);
  logits->assign(static_cast<size_t>(n) * V, 0.0f);
  std::vector<float> row;
  for (int r = 0; r < n; ++r) {
    if (positions[r] < 0) continue;
    use_sequence(r);
    forward(tokens + r, 1, positions[r], &row);
    std::copy(row.begin(), row.end(), logits->begin() + static_cast<ptrdiff_t>(r * V));
  }
}

void Decoder::forward_batch_next(const int32_t* tokens, const int32_t* positions, int n, const SamplingOptions& o,
                                 const uint64_t* draws, int32_t* next) {
  std::vector<float> rows;
  forward_batch(tokens, positions, n, &rows);
  if (!stage_.last()) return;  // the last stage's tokens: step_batch_next broadcasts them
  const auto V = static_cast<ptrdiff_t>(cfg_.vocab_size);
  for (int r = 0; r < n; ++r) {
    if (positions[r] < 0) continue;
    next[r] = sample_token(std::vector<float>(rows.begin() + r * V, rows.begin() + (r + 1) * V), o, draws[r]);
  }
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

std::string DecoderFootprint::breakdown() const {
  return str_cat("weights ", format_gib(weights), ", key/value caches ", format_gib(cache), ", activations ",
                 format_gib(activations), ", runtime ", format_gib(runtime), "; total ", format_gib(total()));
}

DecoderFootprint decoder_footprint(const ModelConfig& model, DType dtype, int max_batch, const DecoderStage& stage) {
  const int64_t e = dtype == DType::kF32 ? 4 : 2;
  const std::vector<bool> held = held_units(model, stage);
  DecoderFootprint f;
  for (const UnitLayout& u : build_units(model))
    if (held[static_cast<size_t>(u.index)]) f.weights += e * u.numel;
  const int64_t kv = int64_t{model.kv_heads()} * model.head_dim();
  f.cache = 2 * e * stage_layers(model, stage).count() * int64_t{max_batch} * model.seq_len * kv;
  // The families' row buffers (x, norm, attention out, qkv, the MLP's widest two) over the widest forward, the token
  // and position uploads, the draw indices, the logits rows and the kernels' scratch (decode_step_scratch_bytes). The
  // weights come up already rounded to the compute type (a GPU decoder rounds them on the host), with no staging on
  // the device.
  const int64_t rows = std::max<int64_t>(model.seq_len, max_batch);
  const int64_t row = 3 * model.n_embd + model.qkv_dim() + 3 * int64_t{model.mlp_dim()};
  const auto scratch = static_cast<int64_t>(
      gpu::decode_step_scratch_bytes(max_batch, model.n_head, model.head_dim(), model.seq_len, model.vocab_size));
  const int64_t logits = stage.last() ? e * int64_t{max_batch} * model.padded_vocab() : 0;
  f.activations = e * rows * row + 8 * rows + 8 * int64_t{max_batch} + logits + scratch;
  f.runtime = int64_t{768} << 20;
  return f;
}

std::unique_ptr<Decoder> load_decoder(std::unique_ptr<Decoder> d, std::vector<std::vector<float>> weights) {
  check_decoder_weights(d->config(), weights);
  for (size_t u = 0; u < weights.size(); ++u) {
    if (d->holds(static_cast<int>(u))) d->load_unit(static_cast<int>(u), weights[u]);
    std::vector<float>().swap(weights[u]);  // a GPU decoder has its copy: the host's goes at once
  }
  return d;
}

std::unique_ptr<Decoder> make_decoder(const Config& cfg, std::vector<std::vector<float>> weights, int cuda_device) {
  return load_decoder(make_unloaded_decoder(cfg, cuda_device), std::move(weights));
}

std::unique_ptr<Decoder> make_unloaded_decoder(const Config& cfg, int cuda_device, int max_batch,
                                               const DecoderStage& stage) {
  if (cfg.train.device == Device::kCpu)
    return model_family(cfg.model.arch).make_cpu_decoder(cfg.model, max_batch, stage);
#ifdef SHARDTRAIN_HAVE_CUDA
  return make_cuda_decoder(cfg.model, cfg.compute_dtype(), cuda_device, max_batch, stage);
#else
  ST_BAD_INPUT(
      "train.device = cuda, but this shardtrain was built without the CUDA backend (nvcc was not found "
      "at configure time, or -DSHARDTRAIN_CUDA=OFF); use train.device = cpu or rebuild with CUDA");
#endif
}

}  // namespace st
