// Autoregressive decoding with a key/value cache: a model's forward for one new token at a time, which keeps every
// earlier position's keys and values instead of recomputing the whole window. One implementation per family and
// device behind this interface: GptDecoder and LlamaDecoder on the CPU (fp32, the reference), CudaGptDecoder and
// CudaLlamaDecoder on a GPU (the compute type: fp32, bf16 or fp16).
//
//   std::unique_ptr<Decoder> d = make_decoder(cfg, engine.gather_params());   // the full weights of every unit
//   std::vector<float> logits = d->prefill(prompt);   // positions 0 .. prompt.size() - 1
//
// A loader that reads the weights unit by unit hands each over as it comes, so that the whole model in fp32 is never
// on the host (ckpt/decode_weights.h streams checkpoints and init.from that way):
//   std::unique_ptr<Decoder> d = make_unloaded_decoder(cfg);
//   d->load_unit(u, values);                          // each unit once, its full flat fp32 buffer
//   logits = d->step(next);                           // one more position; d->position() counts them
//
// The cache holds model.seq_len positions (max_length()): the positions a model knows (gpt2's wpe has seq_len rows).
// A step on a full cache is an error; a caller that needs more tokens prefills again with a shorter context
// (generate_tokens in generation.h slides the window that way).
//
// A decoder made for max_batch sequences holds a cache for each and steps them together, one token each:
//   d->prefill(prompt_a, 0);  d->prefill(prompt_b, 1);
//   const std::vector<float>& rows = d->step_batch({next_a, next_b});   // [2, vocab_size]
// A sequence given kIdle sits the step out (its cache and position unchanged). The CPU decoders run the rows one
// after another, bit for bit what single steps give; a GPU decoder runs them as one forward, whose products of several
// rows may round differently from one row's.
//
// A decoder made for a stage of a layer split (decoder_stage.h) holds its stage's units and its blocks' caches alone,
// and every call above is collective over the stage's communicator: every rank makes the same calls with the same
// tokens, each forward crosses the ranks once, and each returns on every rank what the whole model's decoder returns
// (the last stage's logits or greedy tokens, broadcast): the same operations on the same rows, split between ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/kernels/adamw_host.h"
#include "shardtrain/model/decoder_stage.h"
#include "shardtrain/model/sampling.h"
#include "shardtrain/model/units.h"

namespace st {

class Decoder {
 public:
  virtual ~Decoder() = default;

  // Unit u's weights: its full flat fp32 buffer (unit.numel values), each unit it holds once, all before the first
  // prefill. The decoder keeps them (the CPU's takes `values` over, leaving it empty) or rounds them to its compute
  // type (a GPU's, leaving `values` as it was, to be reused). kBadInput naming the unit for a wrong size, an unknown
  // unit, one another stage holds or one loaded twice.
  void load_unit(int u, std::vector<float>& values);
  // The 16-bit type the decoder keeps its weights in (a GPU's bf16 or fp16), or kNone (fp32: the CPU's, a GPU's in
  // fp32), and unit u's weights already in it, with load_unit's checks: a GPU decoder uploads their bits as they are,
  // any other widens them (exactly) to fp32 and keeps those.
  virtual HalfKind half_kind() const { return HalfKind::kNone; }
  void load_unit_half(int u, const std::vector<uint16_t>& values, HalfKind kind);
  // Whether every unit it holds is loaded.
  bool loaded() const { return units_loaded_ == units_held_; }
  // The units it holds that are yet to be loaded.
  int units_to_load() const { return units_held_ - units_loaded_; }
  // The units it holds, by index (held_units of its stage: every unit unless split), and its stage.
  const std::vector<bool>& held_units() const { return held_; }
  bool holds(int u) const { return u >= 0 && u < static_cast<int>(held_.size()) && held_[static_cast<size_t>(u)]; }
  const DecoderStage& stage() const { return stage_; }

  // Empties the cache and runs `tokens` (1 to max_length() of them, each in [0, vocab_size)) at positions 0 ..
  // n - 1. Returns the logits over the real vocabulary (model.vocab_size, fp32) for the position after the last.
  // kBadInput for an empty or too long prompt or a token outside the vocabulary.
  const std::vector<float>& prefill(const std::vector<int32_t>& tokens) { return prefill(tokens, 0); }
  // The same for sequence seq of the batch (0 .. max_batch() - 1).
  const std::vector<float>& prefill(const std::vector<int32_t>& tokens, int seq);
  // Runs one token at position() and returns the logits that follow it. Throws (naming the cache's size) when the
  // cache is full(); kBadInput for a token outside the vocabulary.
  const std::vector<float>& step(int32_t token);

  // What step_batch takes for a sequence that sits the step out.
  static constexpr int32_t kIdle = -1;
  // One token for each sequence s < tokens.size() (at most max_batch()) at position(s), in one forward: tokens[s], or
  // kIdle. Returns the logits over the real vocabulary of every row, [tokens.size(), vocab_size] row-major (an idle
  // row's are unspecified). The same checks as step for each stepped sequence.
  const std::vector<float>& step_batch(const std::vector<int32_t>& tokens);
  // The next token of each row of step_batch (kIdle for an idle row): sample_token(its logits, o, draws[s]), the
  // argmax when o.temperature is 0 or o.top_k is 1, a NaN or infinite logit refused as sample_token refuses it
  // (kBadInput). draws: each sequence's draw index (an idle one's unused), as many as tokens. A GPU decoder picks the
  // tokens on the device (argmax_rows, or sample_rows: the same token for the same logits) and hands back the ids
  // alone, in a step it replays as one CUDA graph per batch size and options.
  std::vector<int32_t> step_batch_next(const std::vector<int32_t>& tokens, const SamplingOptions& o,
                                       const std::vector<uint64_t>& draws);

  // Positions in sequence seq's cache: its prompt's and every step's since its last prefill.
  int64_t position(int seq = 0) const { return positions_[static_cast<size_t>(seq)]; }
  int64_t max_length() const { return cfg_.seq_len; }
  bool full(int seq = 0) const { return position(seq) >= max_length(); }
  // The sequences the decoder holds (make_decoder's max_batch).
  int max_batch() const { return static_cast<int>(positions_.size()); }
  const ModelConfig& config() const { return cfg_; }
  // "cpu/fp32", "cuda/bf16 on NVIDIA H200", for logs.
  virtual std::string describe() const = 0;

 protected:
  // kInternal for a split stage whose communicator is not its stages' (rank index of count) or whose units do not
  // form a stage (a block or more; the embedding first on stage 0, the head last on the last).
  Decoder(const ModelConfig& cfg, int max_batch, const DecoderStage& stage);
  // The blocks it runs (stage_layers).
  const LayerRange& layers() const { return layers_; }
  // A split's hidden rows: `bytes` of them from the previous stage's rank, or to the next's.
  void receive_rows(void* rows, int64_t bytes);
  void send_rows(const void* rows, int64_t bytes);
  // Makes sequence seq's cache the one forward() reads and appends to.
  virtual void use_sequence(int seq) = 0;
  // step_batch's forward: row r is sequence r's token at positions[r] (negative: idle), the logits of every row into
  // *logits ([n, vocab_size]). By default forward() row by row. In a split, only the last stage writes the logits
  // (or, below, the tokens) of forward, forward_batch and forward_batch_next: the calls above broadcast them.
  virtual void forward_batch(const int32_t* tokens, const int32_t* positions, int n, std::vector<float>* logits);
  // step_batch_next's: each row's token into next[r] (idle rows: anything), the options checked. By default
  // forward_batch, then sample_token of each row on the host.
  virtual void forward_batch_next(const int32_t* tokens, const int32_t* positions, int n, const SamplingOptions& o,
                                  const uint64_t* draws, int32_t* next);
  // Keeps unit u's weights (load_unit has checked u and the size).
  virtual void store_unit(int u, std::vector<float>& values) = 0;
  // load_unit_half's: by default the values widened to fp32, to store_unit.
  virtual void store_unit_half(int u, const std::vector<uint16_t>& values, HalfKind kind);
  // Runs tokens[0, n) at positions pos .. pos + n - 1 with the cache holding positions 0 .. pos - 1, appends their
  // keys and values to it, and writes the logits over the real vocabulary that follow the last token into *logits.
  // The base class has checked n, pos and the tokens. A stage of a split runs its blocks alone: it receives the hidden
  // rows unless it is the first, and sends them on unless it is the last.
  virtual void forward(const int32_t* tokens, int64_t n, int64_t pos, std::vector<float>* logits) = 0;

 private:
  void check_tokens(const int32_t* tokens, int64_t n, int64_t pos) const;
  void check_loaded() const;
  // load_unit's checks of unit u and its buffer's size.
  void check_unit(int u, int64_t size) const;
  // A split's last stage's `rows` logits rows to every rank.
  void share_logits(int64_t rows);
  // step_batch's checks; the rows' positions (kIdle's negative), and into *ids the tokens the forward runs (an idle
  // row's 0).
  std::vector<int32_t> batch_positions(const std::vector<int32_t>& tokens, std::vector<int32_t>* ids) const;

  ModelConfig cfg_;
  DecoderStage stage_;
  std::vector<UnitLayout> layout_;
  std::vector<bool> held_, loaded_;
  int units_held_ = 0, units_loaded_ = 0;
  LayerRange layers_;
  std::vector<int64_t> positions_;
  std::vector<float> logits_;
};

// The decoder of cfg.model's family on train.device: fp32 on the CPU; on a GPU (CUDA device `cuda_device`, the
// rank's device) in cfg.compute_dtype(), its weights rounded from these. weights: every unit's full flat fp32
// buffer, in unit order (StepEngine::gather_params()). kBadInput for train.device = cuda in a build without CUDA or
// with no such device.
std::unique_ptr<Decoder> make_decoder(const Config& cfg, std::vector<std::vector<float>> weights, int cuda_device = 0);
// The same decoder with no weights yet: load_unit each unit it holds before the first prefill.
// max_batch: the sequences it holds (a cache each); stage: its stage of a layer split (default: the whole model).
std::unique_ptr<Decoder> make_unloaded_decoder(const Config& cfg, int cuda_device = 0, int max_batch = 1,
                                               const DecoderStage& stage = {});
// Loads every unit of `weights` that the unloaded decoder d holds into it (check_decoder_weights first) and returns
// it.
std::unique_ptr<Decoder> load_decoder(std::unique_ptr<Decoder> d, std::vector<std::vector<float>> weights);

// Elements of the compute type in each of the two pinned chunks a GPU decoder uploads a unit through, one rounded on
// the host while the other goes up.
inline constexpr int64_t kDecoderUploadChunk = int64_t{1} << 23;

// The device memory of a GPU decoder of `model` in `dtype` holding max_batch sequences, planned before anything is
// allocated: the weights in the compute type, the key/value caches (keys and values of every layer, max_batch x
// seq_len positions), the activations of the widest forward (a prompt's seq_len rows or a batch's max_batch) with the
// logits rows and the split-K attention's partials, and the runtime's reserve (the CUDA context and cuBLASLt).
// shard/memory_plan.h checks it against the device's budget. For a stage of a layer split (decoder_stage.h): its units'
// weights, its blocks' caches, the same row buffers, and the logits rows on the last stage alone.
struct DecoderFootprint {
  int64_t weights = 0, cache = 0, activations = 0, runtime = 0;
  int64_t total() const { return weights + cache + activations + runtime; }
  // "weights 2.30 GiB, key/value caches 1.00 GiB, activations 0.20 GiB, runtime 0.75 GiB; total 4.25 GiB"
  std::string breakdown() const;
};
DecoderFootprint decoder_footprint(const ModelConfig& model, DType dtype, int max_batch,
                                   const DecoderStage& stage = {});

// The checks every implementation's constructor makes: one buffer per unit of cfg's unit list, each of its size
// (kBadInput naming the unit, expected vs actual).
void check_decoder_weights(const ModelConfig& cfg, const std::vector<std::vector<float>>& weights);

}  // namespace st
