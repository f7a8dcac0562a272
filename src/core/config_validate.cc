// The checks that span keys or ranges a type cannot express, after the file and the overrides are merged.
#include "config_validate.h"

#include <algorithm>
#include <cmath>

#include "config_keys.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "shardtrain/model/lora.h"

namespace st::config_internal {
namespace {

// What INI reading trims from either end of a value (line breaks are refused on their own).
bool is_blank(char c) { return c == ' ' || c == '\t'; }

// The most seconds a timeout may be: about 3 years, far below where a deadline in nanoseconds overflows (292 years).
constexpr double kMaxSeconds = 1e8;
// The most GiB (dist.max_gpu_mem_gib) or MiB (dist.bucket_mb) a size key may be: 2^20, far below where it
// overflows as a byte count.
constexpr double kMaxSizeUnits = 1 << 20;

// Linux's PATH_MAX, with its terminating NUL.
constexpr size_t kMaxPathBytes = 4095;

// The family's own keys: llama's shape and RoPE, or gpt2 with every llama key at its default (a llama key set
// under gpt2 would be parsed and ignored).
template <typename Add, typename FloatCheck>
void check_family_keys(const ModelConfig& m, Add&& add, FloatCheck&& float_check) {
  const ModelConfig d;
  if (m.arch == ModelArch::kGpt2) {
    auto unused = [&](const char* name, bool is_default) {
      if (!is_default) add("model.", name, " applies to model.arch=llama only; this model is gpt2");
    };
    unused("n_kv_head", m.n_kv_head == 0 || m.n_kv_head == m.n_head);
    unused("ffn_dim", m.ffn_dim == 0 || m.ffn_dim == 4 * m.n_embd);
    unused("rope_theta", m.rope_theta == d.rope_theta);
    unused("rope_scaling", m.rope_scaling == d.rope_scaling);
    unused("rope_scaling_factor", m.rope_scaling_factor == d.rope_scaling_factor);
    unused("rope_scaling_low_freq_factor", m.rope_scaling_low_freq_factor == d.rope_scaling_low_freq_factor);
    unused("rope_scaling_high_freq_factor", m.rope_scaling_high_freq_factor == d.rope_scaling_high_freq_factor);
    unused("rope_scaling_original_max_position",
           m.rope_scaling_original_max_position == d.rope_scaling_original_max_position);
    unused("rms_norm_eps", m.rms_norm_eps == d.rms_norm_eps);
    unused("tie_embeddings", m.tie_embeddings);
    unused("qkv_bias", !m.qkv_bias);
    return;
  }
  if (m.n_kv_head < 0) add("model.n_kv_head must be >= 0 (got ", m.n_kv_head, ")");
  if (m.n_kv_head > 0 && m.n_head > 0 && m.n_head % m.n_kv_head != 0)
    add("model.n_head (", m.n_head, ") must be a multiple of model.n_kv_head (", m.n_kv_head, ")");
  if (m.ffn_dim <= 0) add("model.ffn_dim must be > 0 for model.arch=llama (got ", m.ffn_dim, ")");
  if (m.n_head > 0 && m.n_embd > 0 && m.n_embd % m.n_head == 0 && m.head_dim() % 2 != 0)
    add("model.n_embd / model.n_head (the head dimension, ", m.head_dim(), ") must be even for RoPE");
  float_check("model.rope_theta", m.rope_theta, m.rope_theta > 1 && std::isfinite(m.rope_theta), "finite and > 1");
  float_check("model.rms_norm_eps", m.rms_norm_eps, m.rms_norm_eps > 0 && m.rms_norm_eps < 1, "in (0, 1)");
  if (m.rope_scaling == RopeScaling::kLlama3) {
    float_check("model.rope_scaling_factor", m.rope_scaling_factor, m.rope_scaling_factor > 0, "> 0");
    float_check("model.rope_scaling_low_freq_factor", m.rope_scaling_low_freq_factor,
                m.rope_scaling_low_freq_factor > 0, "> 0");
    if (!(m.rope_scaling_high_freq_factor > m.rope_scaling_low_freq_factor))
      add("model.rope_scaling_high_freq_factor (", format_number(m.rope_scaling_high_freq_factor),
          ") must be > model.rope_scaling_low_freq_factor (", format_number(m.rope_scaling_low_freq_factor), ")");
    if (m.rope_scaling_original_max_position <= 0)
      add("model.rope_scaling_original_max_position must be > 0 (got ", m.rope_scaling_original_max_position, ")");
  }
}

// The [lora] keys: their ranges, the family's target names, and what a LoRA run does not take yet. Without LoRA
// (rank 0) every other lora key must keep its default, as it would be parsed and ignored.
template <typename Add, typename FloatCheck>
void check_lora_keys(const Config& c, Add&& add, FloatCheck&& float_check) {
  const LoraConfig& l = c.model.lora;
  const LoraConfig d;
  if (l.rank < 0) add("lora.rank must be >= 0 (got ", l.rank, "; 0: full fine-tuning)");
  if (l.rank <= 0) {
    auto unused = [&](const char* name, bool is_default) {
      if (!is_default) add("lora.", name, " applies when lora.rank > 0 (it is ", l.rank, ": full fine-tuning)");
    };
    unused("alpha", l.alpha == d.alpha);
    unused("dropout", l.dropout == d.dropout);
    unused("targets", l.targets == d.targets);
    unused("rslora", l.rslora == d.rslora);
    unused("base_dtype", l.base_dtype == d.base_dtype);
    unused("from", l.from == d.from);
    return;
  }
  float_check("lora.alpha", l.alpha, l.alpha > 0 && std::isfinite(l.alpha), "finite and > 0");
  float_check("lora.dropout", l.dropout, l.dropout >= 0 && l.dropout < 1, "in [0, 1)");
  try {
    lora_targets(c.model);
  } catch (const Error& e) {
    add(e.what());
  }
  // The end of a run holds the dequantised base only; the original weights are init.from's files.
  if (l.base_dtype == LoraBase::kNf4 && !c.init.from.empty() && !c.ckpt.export_path.empty())
    add("ckpt.export with lora.base_dtype=nf4 would merge the adapters into the NF4-rounded base; merge them into ",
        "init.from's own weights with `shardtrain ckpt export STEP --merged OUT` (docs/lora.md)");
}

}  // namespace

std::vector<std::string> find_problems(const Config& c) {
  std::vector<std::string> problems;
  auto add = [&](auto&&... parts) { problems.push_back(str_cat(parts...)); };
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) add(name, " must be > 0 (got ", v, ")");
  };
  auto at_least = [&](const char* name, int64_t v, int64_t min) {
    if (v < min) add(name, " must be >= ", min, " (got ", v, ")");
  };
  // Written as !(ok) so NaN fails every check.
  auto float_check = [&](const char* name, auto v, bool ok, const char* want) {
    if (!ok) add(name, " must be ", want, " (got ", format_number(v), ")");
  };

  positive("model.n_layer", c.model.n_layer);
  positive("model.n_head", c.model.n_head);
  positive("model.n_embd", c.model.n_embd);
  positive("model.vocab_size", c.model.vocab_size);
  positive("model.seq_len", c.model.seq_len);
  if (c.model.n_head > 0 && c.model.n_embd > 0 && c.model.n_embd % c.model.n_head != 0)
    add("model.n_embd (", c.model.n_embd, ") must be a multiple of model.n_head (", c.model.n_head, ")");
  check_family_keys(c.model, add, float_check);
  check_lora_keys(c, add, float_check);

  positive("train.steps", c.train.steps);
  positive("train.global_batch", c.train.global_batch);
  positive("train.micro_batch", c.train.micro_batch);
  at_least("train.eval_every", c.train.eval_every, 0);
  at_least("train.eval_batches", c.train.eval_batches, 1);
  at_least("train.sample_tokens", c.train.sample_tokens, 0);

  const auto& o = c.optim;
  float_check("optim.lr", o.lr, o.lr > 0 && std::isfinite(o.lr), "finite and > 0");
  if (!(o.min_lr >= 0 && o.min_lr <= o.lr))
    add("optim.min_lr (", format_number(o.min_lr), ") must be in [0, optim.lr] = [0, ", format_number(o.lr), "]");
  at_least("optim.warmup_steps", o.warmup_steps, 0);
  at_least("optim.decay_steps", o.decay_steps, 0);
  if (o.decay_steps > 0 && c.train.steps > 0 && o.warmup_steps >= 0 && o.decay_steps > c.train.steps - o.warmup_steps)
    add("optim.decay_steps (", o.decay_steps, ") must be at most train.steps - optim.warmup_steps = ", c.train.steps,
        " - ", o.warmup_steps, " = ", c.train.steps - o.warmup_steps,
        " (0: the decay spans every step after the warmup)");
  float_check("optim.weight_decay", o.weight_decay, o.weight_decay >= 0 && std::isfinite(o.weight_decay), ">= 0");
  float_check("optim.beta1", o.beta1, o.beta1 >= 0 && o.beta1 < 1, "in [0, 1)");
  float_check("optim.beta2", o.beta2, o.beta2 >= 0 && o.beta2 < 1, "in [0, 1)");
  float_check("optim.eps", o.eps, o.eps > 0 && std::isfinite(o.eps), "> 0");
  float_check("optim.grad_clip", o.grad_clip, o.grad_clip >= 0 && std::isfinite(o.grad_clip), ">= 0 (0: off)");
  at_least("optim.offload_threads", o.offload_threads, 0);
  float_check("optim.offload_fraction", o.offload_fraction, o.offload_fraction > 0 && o.offload_fraction <= 1,
              "in (0, 1]");
  if (o.offload == OffloadMode::kNone && o.offload_fraction != 1.0f)
    add("optim.offload_fraction (", format_number(o.offload_fraction),
        ") needs optim.offload optimizer or optimizer+params (it is none)");
  if (o.offload_speculative == Speculation::kOn && (c.train.device != Device::kCuda || o.offload == OffloadMode::kNone))
    add("optim.offload_speculative (true) needs train.device=cuda and optim.offload optimizer or optimizer+params",
        " (they are ", to_string(c.train.device), " and ", to_string(o.offload), ")");
  if (c.train.device == Device::kCuda && o.offload != OffloadMode::kNone && c.compute_dtype() == DType::kF32)
    add("optim.offload (", to_string(o.offload),
        ") needs train.dtype bf16 or fp16 on cuda (the host AdamW writes the half-precision shard the GPU gathers)");
  if (c.train.device == Device::kCpu && o.offload == OffloadMode::kOptimizerParams)
    add("optim.offload (optimizer+params) applies to train.device=cuda; on cpu the parameters are in host memory "
        "already (optimizer runs the host AdamW threads)");

  if (c.data.path.empty()) add("data.path must not be empty");
  float_check("data.val_holdout", c.data.val_holdout, c.data.val_holdout >= 0 && c.data.val_holdout < 1, "in [0, 1)");

  at_least("ckpt.every", c.ckpt.every, 0);
  at_least("ckpt.keep", c.ckpt.keep, 0);
  if (c.ckpt.resume.empty()) add("ckpt.resume must be auto, none, or a checkpoint directory (got an empty value)");
  if (c.ckpt.replicas != 0 && c.ckpt.replicas != 1)
    add("ckpt.replicas (", c.ckpt.replicas,
        ") must be 0 (a shared ckpt.dir) or 1 (node-local ckpt.dirs, each node's "
        "files replicated on the previous node)");
  for (const auto& [key, value] : {std::pair<const char*, const std::string&>{"ckpt.dir", c.ckpt.dir},
                                   std::pair<const char*, const std::string&>{"ckpt.resume", c.ckpt.resume}})
    if (c.ckpt.replicas == 0 && value.find("{node}") != std::string::npos)
      add(key, " ('", value,
          "') contains {node}, which gives each node a directory of its own: that needs "
          "ckpt.replicas=1 (with ckpt.replicas=0, ckpt.dir is one directory that every node shares)");

  at_least("log.every", c.log.every, 1);
  if (c.train.device == Device::kCpu && c.train.dtype != DType::kF32 && c.train.dtype != DType::kAuto)
    add("train.dtype (", to_string(c.train.dtype), ") must be fp32 when train.device is cpu");
  if (c.train.fp8 != Fp8Recipe::kOff && c.train.device == Device::kCuda && c.compute_dtype() == DType::kF16)
    add("train.fp8 (", to_string(c.train.fp8), ") needs train.dtype bf16 or fp32 (its GEMMs write those), not fp16");
  if (c.train.fp8_fast_accum && c.train.fp8 == Fp8Recipe::kOff)
    add("train.fp8_fast_accum (true) applies to the FP8 GEMMs: set train.fp8 (tensorwise, rowwise or delayed), or "
        "leave it false");
  if (c.train.fp8_fast_accum && c.train.device == Device::kCpu)
    add("train.fp8_fast_accum (true) applies to train.device=cuda; the cpu backend accumulates its emulated FP8 GEMMs "
        "in fp32 and takes false");
  if (c.train.recompute_blocks < 0 || c.train.recompute_blocks > c.model.n_layer)
    add("train.recompute_blocks must be in [0, model.n_layer = ", c.model.n_layer, "] (got ", c.train.recompute_blocks,
        ")");
  else if (c.train.recompute_blocks != 0 && !c.train.recompute)
    add("train.recompute_blocks (", c.train.recompute_blocks,
        ") applies to train.recompute=true (got false): set train.recompute=true, or leave it at 0");
  if (c.train.fp8_amax_history < 1 || c.train.fp8_amax_history > 1024)
    add("train.fp8_amax_history must be in [1, 1024] (got ", c.train.fp8_amax_history, ")");
  else if (c.train.fp8_amax_history != TrainConfig{}.fp8_amax_history && c.train.fp8 != Fp8Recipe::kDelayed)
    add("train.fp8_amax_history (", c.train.fp8_amax_history, ") applies to train.fp8=delayed (got ",
        to_string(c.train.fp8), "): set train.fp8=delayed, or leave it at ", TrainConfig{}.fp8_amax_history);
  if (c.dist.fp8_gather && c.train.fp8 != Fp8Recipe::kTensorwise && c.train.fp8 != Fp8Recipe::kDelayed)
    add("dist.fp8_gather (true) needs train.fp8=tensorwise or delayed (got ", to_string(c.train.fp8),
        "): the gathered codes serve the forward and, transposed, the backward, which takes one scale a tensor");
  if (c.dist.fp8_gather_keep && !c.dist.fp8_gather)
    add("dist.fp8_gather_keep (true) keeps what dist.fp8_gather casts: set dist.fp8_gather=true, or leave it at false");
  if (c.dist.fp8_gather && c.model.lora.rank > 0 && c.model.lora.base_dtype == LoraBase::kNf4)
    add("dist.fp8_gather (true) does not apply with lora.base_dtype=nf4: that base is gathered as NF4 already");
  if (c.train.device == Device::kCpu && c.train.attention != AttentionImpl::kAuto)
    add("train.attention (", to_string(c.train.attention), ") applies to train.device=cuda; cpu takes auto");
  if (c.train.attention == AttentionImpl::kCudnn && c.compute_dtype() == DType::kF32)
    add("train.attention (cudnn) needs train.dtype bf16 or fp16 (cuDNN's fused attention has no fp32 engine)");
  float_check("dist.timeout_s", c.dist.timeout_s, c.dist.timeout_s >= 0 && c.dist.timeout_s <= kMaxSeconds,
              "in [0, 1e8] (0: no deadline)");
  float_check("dist.rendezvous_timeout_s", c.dist.rendezvous_timeout_s,
              c.dist.rendezvous_timeout_s > 0 && c.dist.rendezvous_timeout_s <= kMaxSeconds, "in (0, 1e8]");
  float_check("dist.max_gpu_mem_gib", c.dist.max_gpu_mem_gib,
              c.dist.max_gpu_mem_gib >= 0 && c.dist.max_gpu_mem_gib <= kMaxSizeUnits, "in [0, 1048576] (0: no cap)");
  float_check("dist.max_host_mem_gib", c.dist.max_host_mem_gib,
              c.dist.max_host_mem_gib >= 0 && c.dist.max_host_mem_gib <= kMaxSizeUnits, "in [0, 1048576] (0: no cap)");
  if (c.dist.prefetch_depth < -1 || c.dist.prefetch_depth > kMaxPrefetchDepth)
    add("dist.prefetch_depth (", c.dist.prefetch_depth, ") must be -1 (the link's default) or in [0, ",
        kMaxPrefetchDepth, "]");
  if (c.dist.reduce_scatter_ctas < -1 || c.dist.reduce_scatter_ctas > kMaxNcclCtas)
    add("dist.reduce_scatter_ctas (", c.dist.reduce_scatter_ctas,
        ") must be -1 (the link's default), 0 (NCCL's own) or in [1, ", kMaxNcclCtas, "]");
  if (c.train.device == Device::kCpu && !c.train.deterministic)
    add("train.deterministic (false) applies to train.device=cuda; the cpu backend is deterministic and takes",
        " true only");
  if (c.train.device == Device::kCpu && c.dist.gather_engine != CommEngine::kAuto)
    add("dist.gather_engine (", to_string(c.dist.gather_engine),
        ") applies to train.device=cuda (NCCL); the cpu backend takes auto only");
  if (c.train.device == Device::kCpu && c.dist.reduce_engine != CommEngine::kAuto)
    add("dist.reduce_engine (", to_string(c.dist.reduce_engine),
        ") applies to train.device=cuda (NCCL); the cpu backend takes auto only");
  if (c.train.device == Device::kCpu && c.dist.reduce_scatter_ctas != -1)
    add("dist.reduce_scatter_ctas (", c.dist.reduce_scatter_ctas,
        ") applies to train.device=cuda (NCCL); the cpu backend takes -1 only");
  if (c.train.gemm_autotune < 0 || c.train.gemm_autotune > kMaxGemmCandidates)
    add("train.gemm_autotune (", c.train.gemm_autotune, ") must be in [0, ", kMaxGemmCandidates, "]");
  if (c.train.device == Device::kCpu && c.train.gemm_autotune != 0)
    add("train.gemm_autotune (", c.train.gemm_autotune,
        ") applies to train.device=cuda (cuBLASLt); the cpu backend takes 0 only");
  if (c.train.device == Device::kCpu && c.dist.prefetch_depth != -1)
    add("dist.prefetch_depth (", c.dist.prefetch_depth,
        ") applies to train.device=cuda; the cpu backend gathers each unit when it is needed and takes -1 only");
  float_check("dist.bucket_mb", c.dist.bucket_mb,
              c.dist.bucket_mb == -1 || (c.dist.bucket_mb >= 0 && c.dist.bucket_mb <= kMaxSizeUnits),
              "-1 (the default) or in [0, 1048576] (0: one all-reduce per unit)");
  if (c.dist.sharding == ShardingMode::kFull && c.dist.bucket_mb != -1)
    add("dist.bucket_mb (", format_number(c.dist.bucket_mb),
        ") applies to dist.sharding hybrid or auto (it is full: no all-reduce across nodes)");

  for (const auto& k : keys()) {
    const std::string v = k.field->format(c);
    // The string keys are paths (and ckpt.resume's words): none is longer than the system's PATH_MAX, and none
    // holds a control character, which no file name needs and a terminal would obey when an error shows it.
    if (v.size() > kMaxPathBytes) {
      add(k.full_name(), " is ", v.size(), " bytes, longer than a path can be (", kMaxPathBytes, "): '", excerpt(v),
          "'");
      continue;
    }
    const auto control = std::find_if(v.begin(), v.end(), [](char ch) {
      return (static_cast<unsigned char>(ch) < 0x20 && ch != '\t') || ch == 0x7F;
    });
    // to_ini() must be able to write every value back: INI values are trimmed and '#' starts a comment.
    if (v.find('#') != std::string::npos || control != v.end() ||
        (!v.empty() && (is_blank(v.front()) || is_blank(v.back()))))
      add(k.full_name(), " ('", excerpt(v), "') cannot be written to INI: no '#', control characters such as line ",
          "breaks, or leading/trailing spaces");
  }
  return problems;
}

}  // namespace st::config_internal
