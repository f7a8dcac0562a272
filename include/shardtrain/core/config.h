// The run configuration: INI sections [model] [train] [optim] [data] [ckpt] [init] [log] [dist], parsed once with
// Boost.ProgramOptions into an immutable Config that is passed explicitly (no globals).
//
// Any key can be overridden on the command line as --section.key=value; the command line wins. Unknown sections or
// keys are refused (the error names the key and the file); a value of the wrong type names the key and the value.
//
// The key table in src/core/config_keys.cc describes every key (meaning, unit, range, default); `shardtrain --help`
// prints it and docs/config.md is generated from it (config_markdown()). The fields below carry at most a unit or
// type note. Each enum's names are the EnumNames table beside it (enum_names.h): to_string() gives a value's name,
// and a key of that enum takes exactly those names.
//
//   st::Config cfg = st::load_config("configs/tiny.ini", {"--train.steps=10"});
//   int accum = cfg.grad_accum_steps(/*world_size=*/2);  // throws kBadInput if it does not divide
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shardtrain/core/enum_names.h"

namespace st {

// The model families: GPT-2 (LayerNorm, learned positions, GELU MLP, biases, tied head) and Llama (RMSNorm, RoPE,
// grouped-query attention, SwiGLU MLP, no biases but optional q/k/v biases, tied or untied head). Qwen 2.5 is llama
// with qkv_bias; SmolLM2 is a llama shape.
enum class ModelArch { kGpt2, kLlama };
template <>
struct EnumNames<ModelArch> {
  static constexpr EnumName<ModelArch> kList[] = {{ModelArch::kGpt2, "gpt2"}, {ModelArch::kLlama, "llama"}};
};
enum class RopeScaling { kNone, kLlama3 };  // kLlama3: Hugging Face's rope_type "llama3"
template <>
struct EnumNames<RopeScaling> {
  static constexpr EnumName<RopeScaling> kList[] = {{RopeScaling::kNone, "none"}, {RopeScaling::kLlama3, "llama3"}};
};

// lora.base_dtype: how the frozen base of a LoRA run is stored. bf16 is the compute dtype (bf16 on cuda, fp32 on
// cpu); nf4 is QLoRA's NormalFloat4 with double quantisation (kernels/nf4.h).
enum class LoraBase { kBf16, kNf4 };
template <>
struct EnumNames<LoraBase> {
  static constexpr EnumName<LoraBase> kList[] = {{LoraBase::kBf16, "bf16"}, {LoraBase::kNf4, "nf4"}};
};

// The [lora] section: low-rank adapters on a frozen base (PEFT's LoRA). Each targeted linear layer y = W x + b
// becomes y = W x + b + scale B A x, with A [rank, in] and B [out, rank] trained and everything else frozen
// (model/lora.h). It changes the model's unit list, so it lives in ModelConfig.
struct LoraConfig {
  int64_t rank = 0;  // 0: full fine-tuning
  float alpha = 8.0f;
  float dropout = 0.0f;
  std::string targets = "all";  // comma-separated names of the family's linear layers (model/lora.h), or all
  bool rslora = false;          // scale alpha / sqrt(rank) instead of alpha / rank
  LoraBase base_dtype = LoraBase::kBf16;
  std::string from;  // a PEFT adapter directory to start the adapters from; empty: A random, B zero

  bool enabled() const { return rank > 0; }
};

struct ModelConfig {
  ModelArch arch = ModelArch::kGpt2;
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int vocab_size = 256;  // real vocabulary; see padded_vocab()
  int seq_len = 128;     // tokens
  // llama only (gpt2 takes the defaults; validation refuses anything else).
  int n_kv_head = 0;  // 0: n_head (no grouping)
  int ffn_dim = 0;    // SwiGLU hidden width; 0: gpt2's 4 x n_embd (llama needs it set)
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_scaling_factor = 8.0f;
  float rope_scaling_low_freq_factor = 1.0f;
  float rope_scaling_high_freq_factor = 4.0f;
  int rope_scaling_original_max_position = 8192;
  float rms_norm_eps = 1e-5f;
  bool tie_embeddings = true;
  bool qkv_bias = false;
  LoraConfig lora;  // keys lora.*

  // vocab_size rounded up to a multiple of 128 (50257 -> 50304): the embedding's rows in memory.
  int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
  bool is_llama() const { return arch == ModelArch::kLlama; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_dim() const { return n_embd / n_head; }
  // Width of the fused q/k/v activation: n_embd for q, head_dim per K/V head for k and v.
  int qkv_dim() const { return (n_head + 2 * kv_heads()) * head_dim(); }
  // Hidden width of the MLP: ffn_dim when set, else 4 x n_embd.
  int mlp_dim() const { return ffn_dim > 0 ? ffn_dim : 4 * n_embd; }
};

enum class Device { kCpu, kCuda };
template <>
struct EnumNames<Device> {
  static constexpr EnumName<Device> kList[] = {{Device::kCpu, "cpu"}, {Device::kCuda, "cuda"}};
};
enum class DType { kAuto, kF32, kBF16, kF16 };  // compute precision; Config::compute_dtype() resolves kAuto
template <>
struct EnumNames<DType> {
  static constexpr EnumName<DType> kList[] = {
      {DType::kAuto, "auto"}, {DType::kF32, "fp32"}, {DType::kBF16, "bf16"}, {DType::kF16, "fp16"}};
};
// Bytes of one element of a compute type: the one table the memory plans size buffers by (kAuto: resolve first).
int64_t dtype_bytes(DType t);
enum class AttentionImpl { kAuto, kCudnn, kFlash };
template <>
struct EnumNames<AttentionImpl> {
  static constexpr EnumName<AttentionImpl> kList[] = {
      {AttentionImpl::kAuto, "auto"}, {AttentionImpl::kCudnn, "cudnn"}, {AttentionImpl::kFlash, "flash"}};
};

// train.fp8: the blocks' linear layers in FP8 (model/fp8_policy.h): off, dynamic per-tensor scales, per-row ones, or
// per-tensor scales from the maxima of earlier steps (model/fp8_history.h).
enum class Fp8Recipe { kOff, kTensorwise, kRowwise, kDelayed };
template <>
struct EnumNames<Fp8Recipe> {
  static constexpr EnumName<Fp8Recipe> kList[] = {{Fp8Recipe::kOff, "off"},
                                                  {Fp8Recipe::kTensorwise, "tensorwise"},
                                                  {Fp8Recipe::kRowwise, "rowwise"},
                                                  {Fp8Recipe::kDelayed, "delayed"}};
};

struct TrainConfig {
  int64_t steps = 600;
  int64_t global_batch = 16;  // sequences, over all ranks
  int64_t micro_batch = 16;   // sequences, per rank
  uint64_t seed = 1337;
  int64_t eval_every = 100;     // steps
  int64_t eval_batches = 8;     // micro-batches, per rank
  int64_t sample_tokens = 200;  // bytes
  bool recompute = false;
  int64_t recompute_blocks = 0;  // with recompute: the first n blocks recompute (0: all; model/recompute.h)
  Device device = Device::kCpu;
  DType dtype = DType::kAuto;
  AttentionImpl attention = AttentionImpl::kAuto;
  bool deterministic = true;
  int64_t gemm_autotune = 0;  // cuBLASLt candidates timed per GEMM shape, <= kMaxGemmCandidates
  Fp8Recipe fp8 = Fp8Recipe::kOff;
  bool fp8_fast_accum = false;  // cuda: the FP8 forward GEMMs without fp32 promotion (model/fp8_policy.h)
  int fp8_amax_history = 16;    // train.fp8=delayed: steps of maxima a scale looks back over (model/fp8_history.h)
};

enum class OffloadMode { kNone, kOptimizer, kOptimizerParams };
template <>
struct EnumNames<OffloadMode> {
  static constexpr EnumName<OffloadMode> kList[] = {{OffloadMode::kNone, "none"},
                                                    {OffloadMode::kOptimizer, "optimizer"},
                                                    {OffloadMode::kOptimizerParams, "optimizer+params"}};
};
enum class Speculation { kAuto, kOn, kOff };  // optim.offload_speculative: auto, true, false
template <>
struct EnumNames<Speculation> {
  static constexpr EnumName<Speculation> kList[] = {
      {Speculation::kAuto, "auto"}, {Speculation::kOn, "true"}, {Speculation::kOff, "false"}};
};

enum class LrDecay { kCosine, kLinear, kSqrt };  // optim.decay: the shape of the fall from optim.lr to optim.min_lr
template <>
struct EnumNames<LrDecay> {
  static constexpr EnumName<LrDecay> kList[] = {
      {LrDecay::kCosine, "cosine"}, {LrDecay::kLinear, "linear"}, {LrDecay::kSqrt, "sqrt"}};
};

struct OptimConfig {
  float lr = 3e-3f;
  float min_lr = 3e-4f;
  int64_t warmup_steps = 30;
  LrDecay decay = LrDecay::kCosine;
  int64_t decay_steps = 0;  // 0: the decay spans every step after the warmup; else the last decay_steps steps
  float weight_decay = 0.1f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float grad_clip = 1.0f;  // global norm; 0: off
  OffloadMode offload = OffloadMode::kNone;
  int64_t offload_threads = 0;    // 0: automatic
  float offload_fraction = 1.0f;  // share of the parameters, in (0, 1]
  Speculation offload_speculative = Speculation::kAuto;
};

enum class DataFormat { kLlmc, kText };
template <>
struct EnumNames<DataFormat> {
  static constexpr EnumName<DataFormat> kList[] = {{DataFormat::kLlmc, "llmc"}, {DataFormat::kText, "text"}};
};
// data.loss_mask: auto reads the llm.c shards' loss masks (NAME.mask beside NAME.bin) where they exist; off reads none.
enum class LossMaskMode { kAuto, kOff };
template <>
struct EnumNames<LossMaskMode> {
  static constexpr EnumName<LossMaskMode> kList[] = {{LossMaskMode::kAuto, "auto"}, {LossMaskMode::kOff, "off"}};
};

struct DataConfig {
  std::string path = "@fortunes";  // a file, a glob, or @fortunes
  DataFormat format = DataFormat::kText;
  std::string val_path;       // empty: hold out val_holdout
  double val_holdout = 0.05;  // fraction, in [0, 1)
  bool shuffle = true;
  LossMaskMode loss_mask = LossMaskMode::kAuto;
  std::string tokenizer;  // a Hugging Face tokenizer.json for text output; empty: none
};

// ckpt.on_error: what a failed checkpoint save does to the run (the save itself is never committed).
enum class CkptOnError { kStop, kWarn };
template <>
struct EnumNames<CkptOnError> {
  static constexpr EnumName<CkptOnError> kList[] = {{CkptOnError::kStop, "stop"}, {CkptOnError::kWarn, "warn"}};
};

struct CkptConfig {
  std::string dir;                 // empty: no checkpoints
  int64_t every = 0;               // steps; 0: only at the end
  int64_t keep = 3;                // 0: all
  std::string resume = "auto";     // "auto", "none" or a step directory
  std::string export_path;         // key ckpt.export; empty: none
  bool allow_data_change = false;  // resume even if the data order differs from the checkpoint's
  bool async = true;               // write in the background from a snapshot; false: training waits for the commit
  CkptOnError on_error = CkptOnError::kStop;
  int64_t replicas = 0;  // 0: one ckpt.dir shared by every node; 1: node-local dirs, each node's files also on the
                         // previous node's disk (ckpt/node_local.h)
};

struct InitConfig {
  std::string from;  // empty: random init
};

struct LogConfig {
  std::string metrics;  // JSONL path; empty: none
  int64_t every = 1;    // steps
};

// The world itself comes from the launcher; these shape how it is used.
enum class ShardingMode { kFull, kHybrid, kAuto };
template <>
struct EnumNames<ShardingMode> {
  static constexpr EnumName<ShardingMode> kList[] = {
      {ShardingMode::kFull, "full"}, {ShardingMode::kHybrid, "hybrid"}, {ShardingMode::kAuto, "auto"}};
};
enum class Bootstrap { kAuto, kMpi, kEnv };  // how the ranks find each other (comm/launcher.h)
template <>
struct EnumNames<Bootstrap> {
  static constexpr EnumName<Bootstrap> kList[] = {
      {Bootstrap::kAuto, "auto"}, {Bootstrap::kMpi, "mpi"}, {Bootstrap::kEnv, "env"}};
};
enum class CommEngine { kAuto, kCopy, kSm };  // what moves a kind of collective on cuda
template <>
struct EnumNames<CommEngine> {
  static constexpr EnumName<CommEngine> kList[] = {
      {CommEngine::kAuto, "auto"}, {CommEngine::kCopy, "copy"}, {CommEngine::kSm, "sm"}};
};

// dist.prefetch_depth's ceiling: each unit of depth holds one more gathered unit of parameters and of gradients.
constexpr int64_t kMaxPrefetchDepth = 8;
// dist.reduce_scatter_ctas's ceiling: NCCL's channel limit (MAXCHANNELS).
constexpr int64_t kMaxNcclCtas = 64;
// train.gemm_autotune's largest candidate list.
constexpr int64_t kMaxGemmCandidates = 64;

struct DistConfig {
  ShardingMode sharding = ShardingMode::kFull;
  bool reshard_after_forward = true;
  double max_gpu_mem_gib = 0;   // GiB; 0: the card's free memory
  double max_host_mem_gib = 0;  // GiB a rank; 0: its share of what the host allows (process_memory.h)
  double timeout_s = 600;       // seconds; 0: no deadline
  Bootstrap bootstrap = Bootstrap::kAuto;
  double rendezvous_timeout_s = 300;  // seconds
  int64_t prefetch_depth = -1;        // units, <= kMaxPrefetchDepth; -1: the link's default
  int64_t reduce_scatter_ctas = -1;   // <= kMaxNcclCtas; 0: NCCL's own; -1: the link's default
  CommEngine gather_engine = CommEngine::kAuto;
  CommEngine reduce_engine = CommEngine::kAuto;
  bool fp8_gather = false;       // the blocks' FP8 weights gathered as E4M3 codes (shard/fp8_gather.h)
  bool fp8_gather_keep = false;  // each rank keeps its codes from a step's first gather of a unit for the step's others
  double bucket_mb = -1;         // MiB; 0: one all-reduce per unit; -1: the default
};

struct Config {
  ModelConfig model;
  TrainConfig train;
  OptimConfig optim;
  DataConfig data;
  CkptConfig ckpt;
  InitConfig init;
  LogConfig log;
  DistConfig dist;
  std::string source;  // the INI file it came from, or "<defaults>"

  // global_batch / (micro_batch * world_size). Throws kBadInput naming all three numbers if it does
  // not divide evenly.
  int64_t grad_accum_steps(int world_size) const;
  // train.dtype with auto resolved: bf16 on cuda, fp32 on cpu.
  DType compute_dtype() const;
};

// The largest config file load_config() reads: a config is a few kB, and a bound keeps /dev/zero or a mistaken
// multi-GB file from being read into memory.
inline constexpr int64_t kMaxConfigBytes = int64_t{1} << 20;

// Parses `path` (if given) and then the --section.key=value overrides, validates cross-key constraints
// (n_embd % n_head == 0, positive sizes, known enum values), and returns the result. Throws st::Error
// of kind kBadInput naming the file and key for anything wrong; a missing file names the path, and so does a path
// that is not a regular file (a FIFO, a device: refused without being opened for reading) or one larger than
// kMaxConfigBytes.
//
// When init.from names a Hugging Face model directory, the model.* keys come from its config.json
// (core/hf_config.h): a key the file or an override sets to another value is kBadInput naming both. A file loaded
// as kDefaults (what `train` runs without --config) sets no key explicitly: config.json's model wins over it.
enum class ConfigFileRole { kChosen, kDefaults };
Config load_config(const std::optional<std::string>& path, const std::vector<std::string>& overrides,
                   ConfigFileRole role = ConfigFileRole::kChosen);

// The same from INI text held in memory (a checkpoint manifest's config); `label` names it in errors.
Config load_config_text(const std::string& ini_text, const std::string& label,
                        const std::vector<std::string>& overrides);

// Every key, one per line: "  section.key  (default: X)  description". Used by --help.
std::string config_help();

// docs/config.md: a header that says how to regenerate the file, then per section a Markdown table of every key
// with what its value must look like, its default and its description. `shardtrain --help-config=markdown` prints
// it.
std::string config_markdown();

// The full config as INI text (every key, including defaults), for logs and checkpoint manifests.
// load_config() of this text yields an equal Config.
std::string to_ini(const Config& cfg);

}  // namespace st
