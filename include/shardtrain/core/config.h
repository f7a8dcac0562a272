// The run configuration: INI sections [model] [train] [optim] [data] [ckpt] [log] [dist], parsed once
// with Boost.ProgramOptions into an immutable Config that is passed explicitly (no globals).
//
// Any key can be overridden on the command line as --section.key=value; the command line wins.
// Unknown sections or keys are refused (the error names the key and the file); a value of the wrong
// type names the key and the value. Every key has a default and a one-line meaning (config_help()).
//
//   st::Config cfg = st::load_config("configs/tiny.ini", {"--train.steps=10"});
//   int accum = cfg.grad_accum_steps(/*world_size=*/2);  // throws kBadInput if it does not divide
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace st {

struct ModelConfig {
  int n_layer = 4;
  int n_head = 4;
  int n_embd = 128;
  int vocab_size = 256;  // real vocabulary; the embedding is padded to padded_vocab() in memory
  int seq_len = 128;     // T: context length, also the size of the position embedding
  // vocab_size rounded up to a multiple of 128 (50257 -> 50304). Padded rows never enter the loss.
  int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
};

enum class Device { kCpu, kCuda };
// Compute precision. Master weights, gradient shards and AdamW state are fp32 in every mode.
enum class DType { kAuto, kF32, kBF16, kF16 };  // auto: bf16 on cuda, fp32 on cpu
// Attention kernels of the cuda backend: cuDNN's fused SDPA (bf16/fp16), our own flash attention (any
// type), or auto: cuDNN where it has an engine for the type and shape, flash attention otherwise.
enum class AttentionImpl { kAuto, kCudnn, kFlash };

struct TrainConfig {
  int64_t steps = 600;        // total optimizer steps (a resumed run continues until this)
  int64_t global_batch = 16;  // sequences per optimizer step, over all ranks
  int64_t micro_batch = 16;   // sequences per rank per micro-step
  uint64_t seed = 1337;       // seeds initialisation and data order
  int64_t eval_every = 100;   // steps between validation passes (0: only at the end)
  int64_t eval_batches = 8;   // micro-batches per validation pass, per rank
  int64_t sample_tokens = 200;  // bytes of text generated at the end of a byte-level run (0: none)
  bool recompute = false;       // keep only block inputs; recompute activations in backward
  Device device = Device::kCpu;
  DType dtype = DType::kAuto;  // see Config::compute_dtype()
  AttentionImpl attention = AttentionImpl::kAuto;
  // cuda: false lets cuDNN's attention backward sum dQ with atomics: faster, but two runs (and a resumed run against
  // an uninterrupted one) differ in the last bits. True: every kernel gives the same bits run after run.
  bool deterministic = true;
  // cuda: cuBLASLt algorithms timed per GEMM (the heuristic's first N; 0 or 1: its first). Rank 0 times, every
  // rank takes its pick, and checkpoints keep the picks for the resumed run. Off by default: the picks win in
  // isolation but lose in sustained training on the H200s (bench/RESULTS.md, session 7).
  int64_t gemm_autotune = 0;
};

// Where the optimizer state lives (train.device=cuda): on the device (none); fp32 master, m and v in host memory
// with AdamW on host threads (optimizer); and also the compute-precision parameter shard (optimizer+params).
enum class OffloadMode { kNone, kOptimizer, kOptimizerParams };
// optim.offload_speculative: auto (on with optim.offload on cuda when the host has memory for the second copy of the
// offloaded state), true, false.
enum class Speculation { kAuto, kOn, kOff };

struct OptimConfig {
  float lr = 3e-3f;
  float min_lr = 3e-4f;  // cosine decay ends here
  int64_t warmup_steps = 30;
  float weight_decay = 0.1f;  // decoupled; applied to matrices only
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float grad_clip = 1.0f;  // global-norm clip; 0 disables
  OffloadMode offload = OffloadMode::kNone;
  int64_t offload_threads = 0;  // host AdamW threads per rank; 0: this rank's share of the CPUs, less one
  float offload_fraction = 1.0f;  // the share of the parameters offloaded: the last units in forward order
  Speculation offload_speculative = Speculation::kAuto;  // host AdamW during backward, unclipped; redo if clipped
};

enum class DataFormat { kLlmc, kText };

struct DataConfig {
  std::string path = "@fortunes";  // a file, a glob, or @fortunes (the built-in corpus)
  DataFormat format = DataFormat::kText;
  std::string val_path;      // empty: hold out the last val_holdout of the training stream
  double val_holdout = 0.05;  // fraction held out when val_path is empty
  bool shuffle = true;        // false: sequential order (see README "Data order")
};

struct CkptConfig {
  std::string dir;            // where step_XXXXXXXX/ checkpoints live (empty: no checkpoints)
  int64_t every = 0;          // steps between saves; a save also happens at the end (0: only at the end)
  int64_t keep = 3;           // committed checkpoints kept (0: all); the one resumed from is never deleted
  std::string resume = "auto";  // auto (latest in dir, if any) | none | a step directory
  std::string export_path;    // ckpt.export: full weights, Hugging Face names, written at the end (empty: none)
};

struct InitConfig {
  std::string from;  // init.from: start from these weights (.safetensors or .h5, HF GPT-2 names); empty: random
};

struct LogConfig {
  std::string metrics;  // JSONL path written by rank 0; empty: none
  int64_t every = 1;    // steps between human-readable lines
};

// The world itself comes from the launcher (mpirun); these shape how it is used.
// How the sharded state spans the world: every rank (full ZeRO-3), or the ranks of one node with a replica per
// node (hybrid, HSDP), or chosen at start from measured bandwidth (auto).
enum class ShardingMode { kFull, kHybrid, kAuto };
// How the ranks find each other (comm/launcher.h): auto (MPI under mpirun, else env when WORLD_SIZE is set, else
// one process), mpi, or env (torchrun / Kubernetes Indexed Job variables and a TCP rendezvous on rank 0).
enum class Bootstrap { kAuto, kMpi, kEnv };
// What moves a kind of collective (cuda): NCCL's copy-engine path (zero CTAs: NVLink peer-to-peer within one node,
// NCCL 2.28+), NCCL's kernels on the SMs, or auto (the measured default for the sharding group's link).
enum class CommEngine { kAuto, kCopy, kSm };

// dist.prefetch_depth's ceiling: each unit of depth holds one more gathered unit of parameters and of gradients.
constexpr int64_t kMaxPrefetchDepth = 8;
// dist.reduce_scatter_ctas's ceiling: NCCL's channel limit (MAXCHANNELS).
constexpr int64_t kMaxNcclCtas = 64;
// train.gemm_autotune's largest candidate list.
constexpr int64_t kMaxGemmCandidates = 64;

struct DistConfig {
  ShardingMode sharding = ShardingMode::kFull;
  bool reshard_after_forward = true;  // ZeRO-3: free gathered params after forward, gather again in backward
  double max_gpu_mem_gib = 0;         // plan-time cap on one rank's device memory (0: the card's free memory)
  double timeout_s = 600;             // deadline of one collective (comm/watchdog.h); 0: none
  Bootstrap bootstrap = Bootstrap::kAuto;
  double rendezvous_timeout_s = 300;  // how long ranks wait for each other in the env bootstrap's rendezvous
  int64_t prefetch_depth = -1;        // units gathered ahead of compute (cuda); -1: the link's default
  int64_t reduce_scatter_ctas = -1;   // NCCL CTAs a reduce-scatter may take (cuda); 0: NCCL's own; -1: the link's
  CommEngine gather_engine = CommEngine::kAuto;  // cuda: the all-gathers on the copy engines or on SMs
  CommEngine reduce_engine = CommEngine::kAuto;  // cuda: the reduce-scatters' exchange on the copy engines or on SMs
  double bucket_mb = -1;  // hybrid's cross-node all-reduce bucket in MiB (0: per unit); -1: the default
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

// Parses `path` (if given) and then the --section.key=value overrides, validates cross-key constraints
// (n_embd % n_head == 0, positive sizes, known enum values), and returns the result. Throws st::Error
// of kind kBadInput naming the file and key for anything wrong; a missing file names the path.
Config load_config(const std::optional<std::string>& path, const std::vector<std::string>& overrides);

// The same from INI text held in memory (a checkpoint manifest's config); `label` names it in errors.
Config load_config_text(const std::string& ini_text, const std::string& label,
                        const std::vector<std::string>& overrides);

// Every key, one per line: "  section.key  (default: X)  meaning". Used by --help.
std::string config_help();

// The full config as INI text (every key, including defaults), for logs and checkpoint manifests.
// load_config() of this text yields an equal Config.
std::string to_ini(const Config& cfg);

const char* to_string(DataFormat f);
const char* to_string(Device d);
const char* to_string(DType t);
const char* to_string(AttentionImpl a);
const char* to_string(OffloadMode m);
const char* to_string(ShardingMode m);
const char* to_string(Bootstrap b);
const char* to_string(CommEngine g);
const char* to_string(Speculation s);

}  // namespace st
