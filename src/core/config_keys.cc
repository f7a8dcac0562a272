// The key table, and what each key's type brings: how a value prints, what a value must look like, and how
// Boost.ProgramOptions parses an enum (by its EnumNames table, enum_names.h).
#include "config_keys.h"

#include <algorithm>
#include <boost/lexical_cast.hpp>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <locale>
#include <optional>
#include <sstream>
#include <type_traits>

namespace po = boost::program_options;

namespace st {

// Boost.ProgramOptions finds this overload by argument-dependent lookup when it parses an enum-valued key: any enum
// with an EnumNames table (enum_names.h) takes exactly the names in it. The error it throws carries no text of ours:
// the catch site rewrites it with the key and allowed values.
template <typename E, typename = std::enable_if_t<kHasEnumNames<E>>>
void validate(boost::any& out, const std::vector<std::string>& values, E*, int) {
  po::validators::check_first_occurrence(out);
  const std::string& s = po::validators::get_single_string(values);
  const std::optional<E> value = enum_from_name<E>(s);
  if (!value) throw po::invalid_option_value(s);
  out = *value;
}

namespace {

template <typename T>
std::string format_float(T v) {
  if (std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < T(1e15)) {
    std::ostringstream os;
    os.imbue(std::locale::classic());
    os << std::fixed << std::setprecision(0) << v;
    return os.str();
  }
  for (int precision = 1; precision <= std::numeric_limits<T>::max_digits10; ++precision) {
    std::ostringstream os;
    os.imbue(std::locale::classic());
    os << std::setprecision(precision) << v;
    try {
      if (boost::lexical_cast<T>(os.str()) == v) return os.str();
    } catch (const boost::bad_lexical_cast&) {
      // inf/nan spellings the parser does not take back; fall through to full precision.
    }
  }
  std::ostringstream os;
  os.imbue(std::locale::classic());
  os << std::setprecision(std::numeric_limits<T>::max_digits10) << v;
  return os.str();
}

template <typename T>
std::string format_value(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_floating_point_v<T>) {
    return format_float(v);
  } else if constexpr (kHasEnumNames<T>) {
    return to_string(v);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return v;
  } else {
    static_assert(std::is_integral_v<T>);
    return std::to_string(v);
  }
}

// What a value of type T must look like, for "bad value ... (expected ...)" messages.
template <typename T>
std::string expected_text() {
  if constexpr (std::is_same_v<T, bool>) {
    return "true/false, 1/0 or yes/no";
  } else if constexpr (kHasEnumNames<T>) {
    return "one of: " + enum_name_list<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    return "a finite number";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "a string";
  } else if constexpr (std::is_unsigned_v<T>) {
    return "a non-negative integer";
  } else {
    return "an integer";
  }
}

template <typename T>
constexpr bool is_integer = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// What INI reading trims from either end of a value.
std::string trimmed(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// [+-]digits: an integer, whatever its size.
bool is_integer_literal(const std::string& s) {
  const size_t digits = s.empty() || (s[0] != '+' && s[0] != '-') ? 0 : 1;
  return s.size() > digits && s.find_first_not_of("0123456789", digits) == std::string::npos;
}

// A decimal number strtold(3) reads whole and finds finite in long double ("1e39", not "inf" or "0x10").
bool is_finite_literal(const std::string& s) {
  if (s.empty() || s.find_first_of("xXnN") != std::string::npos) return false;
  char* end = nullptr;
  const long double v = std::strtold(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(v);
}

// A key's field of type T, reached by `Get`: a generic callable that returns the field of a Config or of a const
// Config (a member of a section, or a member of a struct inside one, as lora.* inside ModelConfig).
template <typename T, typename Get>
class MemberField final : public config_internal::Field {
 public:
  explicit MemberField(Get get) : get_(get) {}

  void add_to(po::options_description& desc, const std::string& key, const char* description,
              Config& cfg) const override {
    desc.add_options()(key.c_str(), po::value<T>(&get_(cfg)), description);
  }
  std::string format(const Config& cfg) const override { return format_value(get_(cfg)); }
  void copy(const Config& from, Config& to) const override { get_(to) = get_(from); }
  std::string expected() const override { return expected_text<T>(); }
  std::vector<std::string> choices() const override {
    std::vector<std::string> names;
    if constexpr (kHasEnumNames<T>)
      for (const EnumName<T>& n : EnumNames<T>::kList) names.emplace_back(n.name);
    return names;
  }
  bool rejects(const std::string& raw) const override {
    if constexpr (std::is_same_v<T, std::string>) {
      return false;
    } else {
      const std::string text = trimmed(raw);
      if (text.empty()) return true;
      if constexpr (is_integer<T>) {
        if constexpr (std::is_unsigned_v<T>) return text.front() == '-';
      } else if constexpr (std::is_floating_point_v<T>) {
        // Boost parses inf and nan; a training run cannot use either.
        try {
          return !std::isfinite(boost::lexical_cast<T>(text));
        } catch (const boost::bad_lexical_cast&) {
          return false;  // Boost refuses it too, and the caller asks why_bad()
        }
      }
      return false;
    }
  }
  std::string why_bad(const std::string& raw) const override {
    const std::string text = trimmed(raw);
    if constexpr (is_integer<T>) {
      if (is_integer_literal(text))
        return "out of range [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
               std::to_string(std::numeric_limits<T>::max()) + "]";
    } else if constexpr (std::is_floating_point_v<T>) {
      if (is_finite_literal(text))
        return "out of range [" + format_float(std::numeric_limits<T>::lowest()) + ", " +
               format_float(std::numeric_limits<T>::max()) + "]";
    }
    return "expected " + expected_text<T>();
  }

 private:
  Get get_;
};

template <typename S, typename T>
config_internal::Key key(const char* section, const char* name, S Config::*outer, T S::*member,
                         const char* description) {
  auto get = [ outer, member ](auto& cfg) -> auto& { return (cfg.*outer).*member; };
  return config_internal::Key{section, name, description, std::make_shared<MemberField<T, decltype(get)>>(get)};
}

// A lora.* key: a member of ModelConfig::lora.
template <typename T>
config_internal::Key lora_key(const char* name, T LoraConfig::*member, const char* description) {
  auto get = [member](auto& cfg) -> auto& { return cfg.model.lora.*member; };
  return config_internal::Key{"lora", name, description, std::make_shared<MemberField<T, decltype(get)>>(get)};
}

}  // namespace

namespace config_internal {

std::string format_number(float v) { return format_float(v); }
std::string format_number(double v) { return format_float(v); }

const std::vector<Key>& keys() {
  // Each description is the key's only one: `shardtrain --help` prints it and docs/config.md is generated from it.
  // Say what the key does, its unit and range where a type does not, and what 0 or -1 mean.
  static const std::vector<Key> table = {
      key("model", "arch", &Config::model, &ModelConfig::arch,
          "model family: gpt2 (LayerNorm, learned positions, GELU MLP, biases, tied head) or llama (Hugging Face's "
          "LlamaForCausalLM: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, no biases; Qwen 2.5 is llama with "
          "model.qkv_bias=true, SmolLM2 a llama shape). The model.* keys below marked llama take their defaults "
          "under gpt2"),
      key("model", "n_layer", &Config::model, &ModelConfig::n_layer, "number of transformer blocks"),
      key("model", "n_head", &Config::model, &ModelConfig::n_head,
          "attention (query) heads per block; must divide model.n_embd, whose quotient is the head dimension"),
      key("model", "n_embd", &Config::model, &ModelConfig::n_embd,
          "embedding width (channels); a multiple of model.n_head"),
      key("model", "vocab_size", &Config::model, &ModelConfig::vocab_size,
          "real vocabulary (256: bytes, 50257: GPT-2); the embedding is padded to a multiple of 128 rows in memory "
          "(50257 -> 50304) and the padded logits never enter the loss"),
      key("model", "seq_len", &Config::model, &ModelConfig::seq_len,
          "context length T in tokens (gpt2: also the length of the position embedding)"),
      key("model", "n_kv_head", &Config::model, &ModelConfig::n_kv_head,
          "llama: key/value heads (grouped-query attention: each serves model.n_head / model.n_kv_head query heads); "
          "must divide model.n_head. 0: model.n_head"),
      key("model", "ffn_dim", &Config::model, &ModelConfig::ffn_dim,
          "llama: hidden width of the SwiGLU MLP (Hugging Face's intermediate_size); required for llama. gpt2: 0 "
          "(its MLP is 4 x model.n_embd)"),
      key("model", "rope_theta", &Config::model, &ModelConfig::rope_theta,
          "llama: RoPE base; the rotation of pair i at position t is t / rope_theta^(2i / head_dim)"),
      key("model", "rope_scaling", &Config::model, &ModelConfig::rope_scaling,
          "llama: none, or llama3 (Hugging Face's rope_type \"llama3\": frequencies below the low-frequency band "
          "are divided by model.rope_scaling_factor, those above the high-frequency band kept, those between "
          "interpolated)"),
      key("model", "rope_scaling_factor", &Config::model, &ModelConfig::rope_scaling_factor,
          "llama3 RoPE scaling: factor (> 0)"),
      key("model", "rope_scaling_low_freq_factor", &Config::model, &ModelConfig::rope_scaling_low_freq_factor,
          "llama3 RoPE scaling: low_freq_factor (> 0)"),
      key("model", "rope_scaling_high_freq_factor", &Config::model, &ModelConfig::rope_scaling_high_freq_factor,
          "llama3 RoPE scaling: high_freq_factor (> model.rope_scaling_low_freq_factor)"),
      key("model", "rope_scaling_original_max_position", &Config::model,
          &ModelConfig::rope_scaling_original_max_position,
          "llama3 RoPE scaling: original_max_position_embeddings (> 0)"),
      key("model", "rms_norm_eps", &Config::model, &ModelConfig::rms_norm_eps,
          "llama: the epsilon of every RMSNorm (> 0)"),
      key("model", "tie_embeddings", &Config::model, &ModelConfig::tie_embeddings,
          "llama: the LM head is the token embedding (true) or a tensor of its own (false). gpt2: true"),
      key("model", "qkv_bias", &Config::model, &ModelConfig::qkv_bias,
          "llama: biases on the q, k and v projections (Qwen 2.5); no other llama layer has a bias. gpt2: false (its "
          "biases are part of the family)"),

      key("train", "steps", &Config::train, &TrainConfig::steps,
          "total optimizer steps (a resumed run continues until this)"),
      key("train", "global_batch", &Config::train, &TrainConfig::global_batch,
          "sequences per optimizer step over all ranks; a multiple of train.micro_batch x world size, the quotient "
          "being the micro-steps whose gradients each step accumulates"),
      key("train", "micro_batch", &Config::train, &TrainConfig::micro_batch, "sequences per rank per micro-step"),
      key("train", "seed", &Config::train, &TrainConfig::seed, "seeds initialisation and data order"),
      key("train", "eval_every", &Config::train, &TrainConfig::eval_every,
          "steps between validation passes (0: only at the end)"),
      key("train", "eval_batches", &Config::train, &TrainConfig::eval_batches,
          "micro-batches per validation pass, per rank (at least 1)"),
      key("train", "sample_tokens", &Config::train, &TrainConfig::sample_tokens,
          "bytes of text generated at the end of a byte-level run (0: none)"),
      key("train", "recompute", &Config::train, &TrainConfig::recompute,
          "keep only each block's input and recompute its activations in backward (less memory, more compute)"),
      key("train", "recompute_blocks", &Config::train, &TrainConfig::recompute_blocks,
          "with train.recompute=true: how many blocks recompute, the first ones (1 to model.n_layer; 0: all). The "
          "others keep their activations: more memory than all, less compute. `shardtrain plan` gives what each "
          "costs"),
      key("train", "gemm_autotune", &Config::train, &TrainConfig::gemm_autotune,
          "cuda: for each GEMM shape, time the first N algorithms of cuBLASLt's heuristic list and keep the fastest "
          "(0 or 1: the heuristic's first, untimed; at most 64). A shape is timed the first time it runs, on scratch "
          "operands filled with uniform random values (a shape whose operands do not fit in the scratch memory keeps "
          "the heuristic's first); rank 0 times and every rank takes its pick. Timings vary, so two fresh tuned runs "
          "may pick differently; tuned or not, a checkpoint records every GEMM's algorithm, and a run resumed on the "
          "same GPU model and cuBLASLt version takes them, so it computes the same bits. 0 by default, since the "
          "timed picks train no faster than the heuristic's at GPT-2 124M and 350M (docs/performance.md, GEMMs); "
          "try it for shapes or GPUs the heuristic may serve less well, and keep it where tokens/s rise. The cpu "
          "backend takes 0 only"),
      key("train", "fp8", &Config::train, &TrainConfig::fp8,
          "the GEMMs of the blocks' linear layers in FP8 (docs/fp8.md): off; tensorwise (E4M3 inputs and "
          "weights, E5M2 gradients, one dynamic scale per tensor); rowwise (the same with a scale per row of each "
          "operand along the dimension the GEMM keeps, powers of two); delayed (as tensorwise, each scale from the "
          "largest maximum its operand had over the last train.fp8_amax_history applied steps, Transformer Engine's "
          "delayed scaling; evaluation and generate scale as tensorwise). Master weights, activations, attention, "
          "norms, embeddings and the classifier stay as train.dtype says. cuda runs cuBLASLt FP8 GEMMs (compute "
          "capability 8.9 or higher; rowwise on Hopper; train.dtype bf16 or fp32); the cpu backend emulates the casts"),
      key("train", "fp8_amax_history", &Config::train, &TrainConfig::fp8_amax_history,
          "train.fp8=delayed: how many applied steps of each operand's maxima its scale looks back over, 1 to 1024 "
          "(the largest of them; a skipped step adds none). The first step, with none, scales as tensorwise. "
          "Checkpoints keep the history, so a resumed run casts as the uninterrupted one"),
      key("train", "fp8_fast_accum", &Config::train, &TrainConfig::fp8_fast_accum,
          "cuda, with train.fp8: the forward GEMMs accumulate in the FP8 tensor cores' own precision throughout "
          "(cuBLASLt's fast accumulation, torchao's choice for the output GEMM) instead of promoting to fp32 at "
          "intervals: faster, less exact; the gradients' GEMMs always promote. The cpu backend, which emulates the "
          "casts around fp32 GEMMs, takes false only"),
      key("train", "device", &Config::train, &TrainConfig::device,
          "cpu (fp32 reference, OpenBLAS, MPI) or cuda (one GPU per rank, NCCL)"),
      key("train", "dtype", &Config::train, &TrainConfig::dtype,
          "compute precision: bf16, fp16 (with dynamic loss scaling), fp32, or auto (bf16 on cuda, fp32 on cpu); "
          "master weights, gradient shards and AdamW state are fp32 in every mode. The cpu backend computes in fp32 "
          "only"),
      key("train", "attention", &Config::train, &TrainConfig::attention,
          "cuda attention kernels: cudnn (cuDNN's fused SDPA; needs bf16 or fp16), flash (shardtrain's own, any "
          "dtype), or auto (cudnn where cuDNN runs the type and shape, else flash). The cpu backend takes auto only"),
      key("train", "deterministic", &Config::train, &TrainConfig::deterministic,
          "cuda: true gives the same bits run after run, so a resumed run repeats the uninterrupted one exactly; "
          "false lets cuDNN's attention backward add dQ with atomics (faster; runs then differ in the last bits). "
          "The cpu backend is deterministic and takes true only"),

      key("optim", "lr", &Config::optim, &OptimConfig::lr,
          "peak learning rate: a linear warmup to it over optim.warmup_steps, held until the decay starts "
          "(optim.decay_steps), then a decay (optim.decay) to optim.min_lr at train.steps"),
      key("optim", "min_lr", &Config::optim, &OptimConfig::min_lr,
          "learning rate at the end of the decay, in [0, optim.lr] (optim.lr: a constant rate after the warmup)"),
      key("optim", "warmup_steps", &Config::optim, &OptimConfig::warmup_steps, "steps of linear warmup to optim.lr"),
      key("optim", "decay", &Config::optim, &OptimConfig::decay,
          "the shape of the decay from optim.lr to optim.min_lr, over a progress p from 0 to 1: cosine "
          "(0.5 (1 + cos(pi p))), linear (1 - p) or sqrt (1 - sqrt(p))"),
      key("optim", "decay_steps", &Config::optim, &OptimConfig::decay_steps,
          "steps the decay spans, the last ones of train.steps, with optim.lr held between the warmup and them "
          "(warmup-stable-decay); 0: every step after the warmup. At most train.steps - optim.warmup_steps"),
      key("optim", "weight_decay", &Config::optim, &OptimConfig::weight_decay,
          "AdamW decoupled weight decay, applied to the blocks' matrices only (biases, LayerNorm gains and the "
          "embeddings do not decay)"),
      key("optim", "beta1", &Config::optim, &OptimConfig::beta1, "AdamW first-moment decay, in [0, 1)"),
      key("optim", "beta2", &Config::optim, &OptimConfig::beta2, "AdamW second-moment decay, in [0, 1)"),
      key("optim", "eps", &Config::optim, &OptimConfig::eps, "AdamW epsilon, > 0"),
      key("optim", "grad_clip", &Config::optim, &OptimConfig::grad_clip, "global gradient-norm clip (0: off)"),
      key("optim", "offload", &Config::optim, &OptimConfig::offload,
          "where the optimizer state lives: none (with the parameters), optimizer (fp32 master weights, m and v in "
          "host memory, AdamW on host threads), or optimizer+params (also the compute-precision parameter shard; "
          "cuda only). On cuda, offloading needs train.dtype bf16 or fp16"),
      key("optim", "offload_threads", &Config::optim, &OptimConfig::offload_threads,
          "host AdamW threads per rank with optim.offload (0: this rank's share of the CPUs, less one for the rank "
          "itself)"),
      key("optim", "offload_fraction", &Config::optim, &OptimConfig::offload_fraction,
          "with optim.offload: offload the units from the last one back until this share of the parameters is "
          "covered, in (0, 1] (1: all); the first units keep their optimizer on the GPU, so the next forward starts "
          "at once"),
      key("optim", "offload_speculative", &Config::optim, &OptimConfig::offload_speculative,
          "with optim.offload on cuda: start a unit's host AdamW during the backward, as soon as its gradient is "
          "on the host, assuming the step is not clipped, into a second copy of the host state (12 more bytes per "
          "offloaded parameter of host memory); a clipped step redoes it, a skipped one drops it, and the step after "
          "either speculates nothing: the results are the same bits either way. true: every offloaded unit; false: "
          "none; auto: as many of the last offloaded units as the rank's host budget holds with their second copies "
          "(all, some or none; docs/offload.md; the log says how many)"),

      key("data", "path", &Config::data, &DataConfig::path,
          "training data: a file, a glob, or @fortunes (the built-in corpus)"),
      key("data", "format", &Config::data, &DataConfig::format,
          "llmc (llm.c .bin token shards) or text (raw bytes, vocab 256)"),
      key("data", "val_path", &Config::data, &DataConfig::val_path,
          "validation data (empty: hold out the last data.val_holdout of the training stream)"),
      key("data", "val_holdout", &Config::data, &DataConfig::val_holdout,
          "fraction of the training stream held out for validation when data.val_path is empty, in [0, 1)"),
      key("data", "shuffle", &Config::data, &DataConfig::shuffle, "shuffle the data order (false: sequential)"),
      key("data", "loss_mask", &Config::data, &DataConfig::loss_mask,
          "auto: where an llm.c shard NAME.bin has a loss mask NAME.mask beside it, train and evaluate only on the "
          "targets it marks (then every file of data.path needs one; data.val_path decides for itself), the loss "
          "being their mean over the step; off: read no mask, every token is a target "
          "(docs/data-format.md)"),
      key("data", "tokenizer", &Config::data, &DataConfig::tokenizer,
          "a Hugging Face tokenizer.json file, at most 64 MiB (the one `shardtrain tokenize` wrote the data with; "
          "the file, not its directory): the end-of-run sample is printed as text through it, and `shardtrain "
          "generate` reads it by default for text (--prompt; --prompt-ids reads none); its vocabulary must fit "
          "model.vocab_size. Empty: byte-level models print bytes, others print no sample"),

      key("ckpt", "dir", &Config::ckpt, &CkptConfig::dir,
          "checkpoint directory: step_XXXXXXXX/ subdirectories and `latest` (empty: no checkpoints)"),
      key("ckpt", "every", &Config::ckpt, &CkptConfig::every,
          "steps between checkpoints; one is also saved at the end (0: only at the end)"),
      key("ckpt", "keep", &Config::ckpt, &CkptConfig::keep,
          "committed checkpoints to keep (0: all); the one resumed from is never deleted"),
      key("ckpt", "resume", &Config::ckpt, &CkptConfig::resume,
          "auto (the latest committed checkpoint in ckpt.dir, if any), none (start from step 0), or a step "
          "directory to resume from"),
      key("ckpt", "allow_data_change", &Config::ckpt, &CkptConfig::allow_data_change,
          "resume even if train.global_batch, data.shuffle, train.seed (shuffled data) or the training data's size "
          "differ from the checkpoint's, which skips or repeats data (the log says which); false: such a resume "
          "is refused with exit code 2, naming each key"),
      key("ckpt", "async", &Config::ckpt, &CkptConfig::async,
          "true: a save copies the state into host memory (pinned, on cuda) at the step boundary and a background "
          "thread writes and commits it while training goes on; the next save, a stop signal and the end of the run "
          "wait for it. false: training waits until the save is committed (no second copy of the state in host "
          "memory)"),
      key("ckpt", "on_error", &Config::ckpt, &CkptConfig::on_error,
          "a save that fails (a full disk, an I/O error) is never committed, and its temporary directory is removed; "
          "stop: the run then stops with exit code 75; warn: it logs the error and trains on"),
      key("ckpt", "replicas", &Config::ckpt, &CkptConfig::replicas,
          "0: ckpt.dir is one directory every node shares (a shared filesystem). 1: node-local checkpoints, for "
          "machines without a shared filesystem: each node saves its ranks' files into its own ckpt.dir (the same "
          "path on each machine's disk, or a path with {node}, which becomes the node id, e.g. ckpt/node{node}: one "
          "directory per node on one host or a shared filesystem) and keeps a replica of the next node's files (the "
          "last node keeps node 0's), so that resume restores a node whose directory was lost from its neighbour. "
          "Needs 2 or more nodes with the same number of ranks and dist.sharding=full; about twice the disk, and "
          "each save sends every rank's file over the network once (docs/checkpoint-format.md). {node} in ckpt.dir "
          "or ckpt.resume needs 1"),
      key("ckpt", "export", &Config::ckpt, &CkptConfig::export_path,
          "at the end, write the full fp32 weights to this HDF5 file, one dataset per tensor under its Hugging Face "
          "name (GPT2LMHeadModel's, or LlamaForCausalLM's for a llama; empty: none). A new file: one that exists is "
          "refused before step 1. A Hugging Face model directory is written from a checkpoint: shardtrain ckpt export "
          "STEP_DIR --out DIR"),

      key("init", "from", &Config::init, &InitConfig::from,
          "start from these weights instead of random init: .safetensors or .h5 with Hugging Face GPT-2 "
          "names, or a Hugging Face llama or qwen2 model directory (config.json and model.safetensors or its "
          "shards), whose config.json sets every model.* key but model.seq_len (a key set to another value is "
          "refused) (empty: random init; ignored when resuming a checkpoint)"),

      lora_key("rank", &LoraConfig::rank,
               "LoRA: the rank r of the adapters trained on a frozen base (0: full fine-tuning). Each targeted linear "
               "layer computes W x + b + scale B A x with A [r, in] (Kaiming-uniform init, as PEFT) and B [out, r] "
               "(zeros); the base (embeddings, norms, biases, every matrix) gets no gradient and no optimizer state"),
      lora_key("alpha", &LoraConfig::alpha, "LoRA: scale = alpha / r (alpha / sqrt(r) with lora.rslora); > 0"),
      lora_key("dropout", &LoraConfig::dropout,
               "LoRA: dropout on each adapter's input during training, in [0, 1) (0: none)"),
      lora_key("targets", &LoraConfig::targets,
               "LoRA: the linear layers of every block that get adapters, comma-separated: q, k, v, o, gate, up, down "
               "(llama) or qkv, proj, fc, fc_proj (gpt2); all: every one of them"),
      lora_key("rslora", &LoraConfig::rslora, "LoRA: rank-stabilised scale alpha / sqrt(r) instead of alpha / r"),
      lora_key("base_dtype", &LoraConfig::base_dtype,
               "LoRA: storage of the frozen base: bf16 (the compute dtype: bf16 on cuda, fp32 on cpu) or nf4 "
               "(QLoRA's 4-bit NormalFloat, blocks of 64 with double-quantised absmaxes: each linear layer's weights, "
               "quantised whole once at load and dequantised into the compute dtype after each gather; embeddings, "
               "the LM head, norms and biases are not quantised)"),
      lora_key("from", &LoraConfig::from,
               "LoRA: start the adapters from a PEFT adapter directory (adapter_config.json and "
               "adapter_model.safetensors, as `ckpt export --adapter` or PEFT's save_pretrained write), whose r, "
               "lora_alpha, use_rslora and target_modules must be these keys' (empty: A random, B zero; not used when "
               "resuming a checkpoint)"),

      key("log", "metrics", &Config::log, &LogConfig::metrics,
          "JSONL metrics file written by rank 0, its directory made if missing (empty: none)"),
      key("log", "every", &Config::log, &LogConfig::every, "steps between human-readable log lines"),

      key("dist", "sharding", &Config::dist, &DistConfig::sharding,
          "full (ZeRO-3 over every rank), hybrid (sharded within a node, replicated across nodes: gathers never "
          "leave the node), or auto (measures the links at start and picks the mode with the least estimated "
          "communication per step that fits in memory; the log says why)"),
      key("dist", "reshard_after_forward", &Config::dist, &DistConfig::reshard_after_forward,
          "true: free each unit's gathered parameters after its forward and gather again in backward (ZeRO-3); "
          "false: keep them until backward (fewer gathers, more memory)"),
      key("dist", "max_gpu_mem_gib", &Config::dist, &DistConfig::max_gpu_mem_gib,
          "cap on the device memory one rank may plan to use, in GiB, at most 1048576 (0: the card's free memory)"),
      key("dist", "max_host_mem_gib", &Config::dist, &DistConfig::max_host_mem_gib,
          "cap on the host memory one rank may plan to use, in GiB, at most 1048576 (0: the rank's share of what the "
          "host, its cgroup and the process's limits allow); the host memory plan is checked against it, and "
          "optim.offload_speculative=auto speculates only what fits under it"),
      key("dist", "timeout_s", &Config::dist, &DistConfig::timeout_s,
          "seconds one collective may take before the watchdog logs the op and ends the job with exit code 75 "
          "(a dead, stopped or hung rank); it must exceed the longest wait for a peer (a checkpoint save, "
          "the first step's planning). 0: no deadline; at most 1e8"),
      key("dist", "bootstrap", &Config::dist, &DistConfig::bootstrap,
          "how ranks find each other: mpi (mpirun), env (WORLD_SIZE, RANK or JOB_COMPLETION_INDEX x LOCAL_WORLD_SIZE + "
          "LOCAL_RANK, MASTER_ADDR, MASTER_PORT: a TCP rendezvous on rank 0, as torchrun and Kubernetes Indexed Jobs "
          "give), auto (mpi under mpirun, else env when WORLD_SIZE is set, else one process); read before the "
          "command runs, from --config and --dist.* on the command line"),
      key("dist", "rendezvous_timeout_s", &Config::dist, &DistConfig::rendezvous_timeout_s,
          "dist.bootstrap=env: seconds the ranks wait for each other at start-up before failing (exit 75); at "
          "most 1e8"),
      key("dist", "prefetch_depth", &Config::dist, &DistConfig::prefetch_depth,
          "cuda: units whose parameter all-gather may run ahead of the unit computing, and gradient buffers whose "
          "reduce-scatter may run behind it (0: gather each unit just before use; at most 8); each adds one unit's "
          "gathered parameters and gradient of memory. -1: the measured default for the sharding group's link "
          "(nvlink 1, pcie 2, network 1; the log says which). The cpu backend gathers synchronously and takes -1 "
          "only"),
      key("dist", "reduce_scatter_ctas", &Config::dist, &DistConfig::reduce_scatter_ctas,
          "cuda: the most CTAs (SMs) NCCL may run a block's gradient reduce-scatter on, through a communicator of "
          "its own, at most 64; fewer leave more of the GPU to the backward it overlaps (the embedding's, which the "
          "next step waits for, keeps NCCL's choice). 0: NCCL's own choice for every reduce-scatter. -1: the "
          "measured default for the sharding group's link (nvlink 4, pcie 0, network 0; the log says which). Set "
          "(0 or more), it keeps dist.reduce_engine=auto on NCCL's kernels and is refused with "
          "dist.reduce_engine=copy. The cpu backend takes -1 only"),
      key("dist", "gather_engine", &Config::dist, &DistConfig::gather_engine,
          "cuda: what moves the parameter all-gathers: copy (NCCL's copy engines, with no SM taken from the compute "
          "they overlap: the sharding group must be one node's GPUs on NVLink with peer-to-peer, and NCCL 2.28 or "
          "newer; refused otherwise), sm (NCCL's kernels), or auto (copy where that holds, else sm; the log says "
          "which). The cpu backend takes auto only"),
      key("dist", "reduce_engine", &Config::dist, &DistConfig::reduce_engine,
          "cuda: what moves the gradient reduce-scatters: copy (each rank's slices go to their owners by NCCL's "
          "copy-engine all-to-all, and the owner adds them in rank order, in fp32, as it takes its shard: no NCCL "
          "kernel beside the backward; same conditions as dist.gather_engine=copy, and a unit-sized receive "
          "buffer), sm (NCCL's reduce-scatter kernels), or auto (copy where that holds and dist.reduce_scatter_ctas "
          "is -1, else sm; the log says which). The cpu backend takes auto only"),
      key("dist", "fp8_gather", &Config::dist, &DistConfig::fp8_gather,
          "train.fp8=tensorwise or delayed: each rank casts its part of every block weight that takes FP8 to E4M3 "
          "(with the whole tensor's scale, whose maximum the ranks exchange first; under delayed, in training, the "
          "amax history's) and the parameter all-gathers move those codes: half the bytes of bf16, a quarter of fp32, "
          "the same bits as casting after the gather, and no second cast of W in the backward (its codes are "
          "transposed). Norms and biases travel in train.dtype. Not with lora.base_dtype=nf4 (that base travels as "
          "NF4)"),
      key("dist", "fp8_gather_keep", &Config::dist, &DistConfig::fp8_gather_keep,
          "dist.fp8_gather: each rank keeps what it sends of a unit (its parts' codes and scales, its norms and "
          "biases) from a training step's first gather of the unit for the step's other gathers of it (every "
          "micro-batch's forward, recompute's and the backward's), which then skip the maxima's exchange and the "
          "casts: the same bits (with optim.offload=optimizer+params they upload nothing either). It costs a byte "
          "per FP8 weight element of the rank's shard and train.dtype's bytes per other element, in the memory "
          "plan's sharded state; evaluation casts afresh"),
      key("dist", "bucket_mb", &Config::dist, &DistConfig::bucket_mb,
          "hybrid sharding: the gradient shards of consecutive units are all-reduced across nodes together, once per "
          "optimizer step, as soon as this many MiB of them are final, at most 1048576 (0: one all-reduce per unit). "
          "-1: the measured "
          "default (0). Applies to dist.sharding hybrid and auto"),
  };
  return table;
}

std::vector<const Key*> keys_in(const std::string& section) {
  std::vector<const Key*> out;
  for (const auto& k : keys())
    if (section == k.section) out.push_back(&k);
  return out;
}

const Key* find_key(const std::string& full_name) {
  for (const auto& k : keys())
    if (k.full_name() == full_name) return &k;
  return nullptr;
}

bool is_section(const std::string& name) {
  return std::find(std::begin(kSections), std::end(kSections), name) != std::end(kSections);
}

std::string section_list() {
  std::string out;
  for (const char* s : kSections) out += (out.empty() ? "" : ", ") + std::string(s);
  return out;
}

}  // namespace config_internal
}  // namespace st
