#include "shardtrain/core/config.h"

#include <algorithm>
#include <boost/lexical_cast.hpp>
#include <boost/program_options.hpp>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <locale>
#include <memory>
#include <sstream>
#include <type_traits>

#include "shardtrain/core/error.h"

namespace po = boost::program_options;

namespace st {
namespace {

// The allowed spellings of each enum-valued key; to_string(), parsing and the error text all read these
// tables (one per enum type, found by overload on a null pointer of that type).
template <typename E>
struct EnumName {
  const char* name;
  E value;
};
constexpr EnumName<DataFormat> kDataFormats[] = {{"llmc", DataFormat::kLlmc}, {"text", DataFormat::kText}};
constexpr EnumName<Device> kDevices[] = {{"cpu", Device::kCpu}, {"cuda", Device::kCuda}};
constexpr EnumName<DType> kDTypes[] = {
    {"auto", DType::kAuto}, {"fp32", DType::kF32}, {"bf16", DType::kBF16}, {"fp16", DType::kF16}};
constexpr EnumName<AttentionImpl> kAttentionImpls[] = {
    {"auto", AttentionImpl::kAuto}, {"cudnn", AttentionImpl::kCudnn}, {"flash", AttentionImpl::kFlash}};
constexpr EnumName<OffloadMode> kOffloadModes[] = {{"none", OffloadMode::kNone},
                                                   {"optimizer", OffloadMode::kOptimizer},
                                                   {"optimizer+params", OffloadMode::kOptimizerParams}};
constexpr EnumName<ShardingMode> kShardingModes[] = {
    {"full", ShardingMode::kFull}, {"hybrid", ShardingMode::kHybrid}, {"auto", ShardingMode::kAuto}};

constexpr EnumName<Speculation> kSpeculations[] = {
    {"auto", Speculation::kAuto}, {"true", Speculation::kOn}, {"false", Speculation::kOff}};

constexpr EnumName<Bootstrap> kBootstraps[] = {
    {"auto", Bootstrap::kAuto}, {"mpi", Bootstrap::kMpi}, {"env", Bootstrap::kEnv}};

const auto& enum_names(const DataFormat*) { return kDataFormats; }
constexpr EnumName<CommEngine> kCommEngines[] = {
    {"auto", CommEngine::kAuto}, {"copy", CommEngine::kCopy}, {"sm", CommEngine::kSm}};

const auto& enum_names(const Bootstrap*) { return kBootstraps; }
const auto& enum_names(const CommEngine*) { return kCommEngines; }
const auto& enum_names(const Speculation*) { return kSpeculations; }
const auto& enum_names(const ShardingMode*) { return kShardingModes; }
const auto& enum_names(const OffloadMode*) { return kOffloadModes; }
const auto& enum_names(const Device*) { return kDevices; }
const auto& enum_names(const DType*) { return kDTypes; }
const auto& enum_names(const AttentionImpl*) { return kAttentionImpls; }

template <typename E>
constexpr bool kIsConfigEnum =
    std::is_same_v<E, DataFormat> || std::is_same_v<E, Device> || std::is_same_v<E, DType> ||
    std::is_same_v<E, AttentionImpl> || std::is_same_v<E, OffloadMode> || std::is_same_v<E, ShardingMode> ||
    std::is_same_v<E, Bootstrap> || std::is_same_v<E, Speculation> || std::is_same_v<E, CommEngine>;

template <typename E>
std::string enum_name_list() {
  std::string out;
  for (const auto& f : enum_names(static_cast<const E*>(nullptr))) out += (out.empty() ? "" : ", ") + std::string(f.name);
  return out;
}

template <typename E>
const char* enum_to_string(E v) {
  for (const auto& entry : enum_names(static_cast<const E*>(nullptr)))
    if (entry.value == v) return entry.name;
  return "?";
}

// The error it throws carries no text of ours: the catch site rewrites it with the key and allowed values.
template <typename E>
void validate_enum(boost::any& out, const std::vector<std::string>& values) {
  po::validators::check_first_occurrence(out);
  const std::string& s = po::validators::get_single_string(values);
  for (const auto& entry : enum_names(static_cast<const E*>(nullptr))) {
    if (s == entry.name) {
      out = entry.value;
      return;
    }
  }
  throw po::invalid_option_value(s);
}

}  // namespace

const char* to_string(DataFormat f) { return enum_to_string(f); }
const char* to_string(Device d) { return enum_to_string(d); }
const char* to_string(DType t) { return enum_to_string(t); }
const char* to_string(AttentionImpl a) { return enum_to_string(a); }
const char* to_string(OffloadMode m) { return enum_to_string(m); }
const char* to_string(ShardingMode m) { return enum_to_string(m); }
const char* to_string(Bootstrap b) { return enum_to_string(b); }
const char* to_string(CommEngine g) { return enum_to_string(g); }
const char* to_string(Speculation s) { return enum_to_string(s); }

// Boost.ProgramOptions finds these overloads by argument-dependent lookup when it parses an enum.
void validate(boost::any& out, const std::vector<std::string>& values, DataFormat*, int) {
  validate_enum<DataFormat>(out, values);
}
void validate(boost::any& out, const std::vector<std::string>& values, Device*, int) {
  validate_enum<Device>(out, values);
}
void validate(boost::any& out, const std::vector<std::string>& values, DType*, int) {
  validate_enum<DType>(out, values);
}
void validate(boost::any& out, const std::vector<std::string>& values, AttentionImpl*, int) {
  validate_enum<AttentionImpl>(out, values);
}
void validate(boost::any& out, const std::vector<std::string>& values, OffloadMode*, int) {
  validate_enum<OffloadMode>(out, values);
}
void validate(boost::any& out, const std::vector<std::string>& values, ShardingMode*, int) {
  validate_enum<ShardingMode>(out, values);
}
void validate(boost::any& out, const std::vector<std::string>& values, Bootstrap*, int) {
  validate_enum<Bootstrap>(out, values);
}
void validate(boost::any& out, const std::vector<std::string>& values, CommEngine*, int) {
  validate_enum<CommEngine>(out, values);
}
void validate(boost::any& out, const std::vector<std::string>& values, Speculation*, int) {
  validate_enum<Speculation>(out, values);
}

namespace {

// ---------------------------------------------------------------------------------------------------
// Printing and describing values of each field type.

// The shortest decimal text that reads back (through the same parser Boost uses) to exactly `v`, so
// to_ini() round-trips and config_help() shows 0.001 rather than 0.00100000005.
template <typename T>
std::string format_float(T v) {
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
  } else if constexpr (kIsConfigEnum<T>) {
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
  } else if constexpr (kIsConfigEnum<T>) {
    return "one of: " + enum_name_list<T>();
  } else if constexpr (std::is_floating_point_v<T>) {
    return "a number";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "a string";
  } else if constexpr (std::is_unsigned_v<T>) {
    return "a non-negative integer";
  } else {
    return "an integer";
  }
}

// ---------------------------------------------------------------------------------------------------
// The one table of keys. Each key is bound to its Config field by pointers-to-member, so the
// options_description, config_help() and to_ini() are all generated from it.

class Field {
 public:
  virtual ~Field() = default;
  // Registers `key` in `desc`; Boost writes the parsed value into this key's field of `cfg` on notify().
  virtual void add_to(po::options_description& desc, const std::string& key, const char* meaning,
                      Config& cfg) const = 0;
  virtual std::string format(const Config& cfg) const = 0;
  virtual std::string expected() const = 0;
  // Texts Boost would take but we do not: an empty value for a non-string (Boost reads an empty bool
  // as true) and a negative unsigned (Boost wraps -1 to 2^64-1).
  virtual bool rejects(const std::string& raw) const = 0;
};

template <typename S, typename T>
class MemberField final : public Field {
 public:
  MemberField(S Config::*section, T S::*member) : section_(section), member_(member) {}

  void add_to(po::options_description& desc, const std::string& key, const char* meaning, Config& cfg) const override {
    desc.add_options()(key.c_str(), po::value<T>(&((cfg.*section_).*member_)), meaning);
  }
  std::string format(const Config& cfg) const override { return format_value((cfg.*section_).*member_); }
  std::string expected() const override { return expected_text<T>(); }
  bool rejects(const std::string& raw) const override {
    if constexpr (std::is_same_v<T, std::string>) {
      return false;
    } else {
      const auto first = raw.find_first_not_of(" \t");
      if (first == std::string::npos) return true;
      if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T> && !std::is_same_v<T, bool>) {
        return raw[first] == '-';
      }
      return false;
    }
  }

 private:
  S Config::*section_;
  T S::*member_;
};

struct Key {
  const char* section;
  const char* name;
  const char* meaning;
  std::shared_ptr<const Field> field;

  std::string full_name() const { return std::string(section) + "." + name; }
};

template <typename S, typename T>
Key key(const char* section, const char* name, S Config::*outer, T S::*member, const char* meaning) {
  return Key{section, name, meaning, std::make_shared<MemberField<S, T>>(outer, member)};
}

constexpr const char* kSections[] = {"model", "train", "optim", "data", "ckpt", "init", "log", "dist"};

const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      key("model", "n_layer", &Config::model, &ModelConfig::n_layer, "number of transformer blocks"),
      key("model", "n_head", &Config::model, &ModelConfig::n_head, "attention heads per block; must divide n_embd"),
      key("model", "n_embd", &Config::model, &ModelConfig::n_embd, "embedding width (channels)"),
      key("model", "vocab_size", &Config::model, &ModelConfig::vocab_size,
          "real vocabulary (256: bytes, 50257: GPT-2); padded to a multiple of 128 in memory"),
      key("model", "seq_len", &Config::model, &ModelConfig::seq_len, "context length T in tokens"),

      key("train", "steps", &Config::train, &TrainConfig::steps,
          "total optimizer steps (a resumed run continues until this)"),
      key("train", "global_batch", &Config::train, &TrainConfig::global_batch,
          "sequences per optimizer step over all ranks; a multiple of micro_batch x world size"),
      key("train", "micro_batch", &Config::train, &TrainConfig::micro_batch, "sequences per rank per micro-step"),
      key("train", "seed", &Config::train, &TrainConfig::seed, "seeds initialisation and data order"),
      key("train", "eval_every", &Config::train, &TrainConfig::eval_every,
          "steps between validation passes (0: only at the end)"),
      key("train", "eval_batches", &Config::train, &TrainConfig::eval_batches,
          "micro-batches per validation pass, per rank"),
      key("train", "sample_tokens", &Config::train, &TrainConfig::sample_tokens,
          "bytes of text generated at the end of a byte-level run (0: none)"),
      key("train", "recompute", &Config::train, &TrainConfig::recompute,
          "keep only each block's input and recompute its activations in backward (less memory)"),
      key("train", "gemm_autotune", &Config::train, &TrainConfig::gemm_autotune,
          "cuda: time the first N algorithms cuBLASLt's heuristic lists for each GEMM shape and keep the fastest "
          "(rank 0 times, every rank takes its pick; checkpoints keep the picks, so a resumed run computes the same "
          "bits). Timed on random operands. 0 or 1: the heuristic's first (the default: on H200s the timed picks "
          "gained 1% at 124M and nothing at 350M in sustained training). The cpu backend takes 0 only"),
      key("train", "device", &Config::train, &TrainConfig::device,
          "cpu (fp32 reference, OpenBLAS, MPI) or cuda (one GPU per rank, NCCL)"),
      key("train", "dtype", &Config::train, &TrainConfig::dtype,
          "compute precision: bf16 (fp32 master weights), fp32 (parity), fp16 (dynamic loss scaling), "
          "auto (bf16 on cuda, fp32 on cpu); cpu computes in fp32 only"),
      key("train", "attention", &Config::train, &TrainConfig::attention,
          "cuda attention kernels: cudnn (cuDNN fused SDPA, bf16/fp16), flash (our own, any dtype), auto "
          "(cudnn where cuDNN runs the type and shape, else flash); cpu takes auto only"),
      key("train", "deterministic", &Config::train, &TrainConfig::deterministic,
          "cuda: true (the default) gives the same bits run after run, so a resumed run repeats the uninterrupted "
          "one exactly; false lets cuDNN's attention backward add dQ with atomics (faster; runs then differ in the "
          "last bits). The cpu backend is deterministic and takes true only"),

      key("optim", "lr", &Config::optim, &OptimConfig::lr, "peak learning rate, reached after warmup"),
      key("optim", "min_lr", &Config::optim, &OptimConfig::min_lr, "learning rate at the end of the cosine decay"),
      key("optim", "warmup_steps", &Config::optim, &OptimConfig::warmup_steps, "steps of linear warmup to lr"),
      key("optim", "weight_decay", &Config::optim, &OptimConfig::weight_decay,
          "AdamW decoupled weight decay, applied to matrices only"),
      key("optim", "beta1", &Config::optim, &OptimConfig::beta1, "AdamW first-moment decay, in [0, 1)"),
      key("optim", "beta2", &Config::optim, &OptimConfig::beta2, "AdamW second-moment decay, in [0, 1)"),
      key("optim", "eps", &Config::optim, &OptimConfig::eps, "AdamW epsilon"),
      key("optim", "grad_clip", &Config::optim, &OptimConfig::grad_clip, "global gradient-norm clip (0: off)"),
      key("optim", "offload", &Config::optim, &OptimConfig::offload,
          "optimizer state in host memory: none, optimizer (fp32 master, m, v; AdamW on host threads), "
          "optimizer+params (also the compute-precision parameter shard; cuda only)"),
      key("optim", "offload_threads", &Config::optim, &OptimConfig::offload_threads,
          "host AdamW threads per rank with optim.offload (0: this rank's share of the CPUs, less one)"),
      key("optim", "offload_fraction", &Config::optim, &OptimConfig::offload_fraction,
          "with optim.offload: offload the units from the last one back until this share of the parameters is "
          "covered (1: all); the first units keep their optimizer on the GPU, so the next forward starts at once"),
      key("optim", "offload_speculative", &Config::optim, &OptimConfig::offload_speculative,
          "with optim.offload on cuda: start each unit's host AdamW during the backward, as soon as its gradient is "
          "on the host, assuming the step is not clipped, into a second copy of the host state (12 more bytes per "
          "offloaded parameter of host memory); a clipped step redoes it, a skipped one drops it: the results are "
          "the same bits either way. true, false, or auto: on with optim.offload on cuda when the node's ranks' "
          "second copies take at most half the host memory available at start (the log says which)"),

      key("data", "path", &Config::data, &DataConfig::path,
          "training data: a file, a glob, or @fortunes (the built-in corpus)"),
      key("data", "format", &Config::data, &DataConfig::format,
          "llmc (llm.c .bin token shards) or text (raw bytes, vocab 256)"),
      key("data", "val_path", &Config::data, &DataConfig::val_path,
          "validation data (empty: hold out the last val_holdout of the training stream)"),
      key("data", "val_holdout", &Config::data, &DataConfig::val_holdout,
          "fraction of the training stream held out when val_path is empty, in [0, 1)"),
      key("data", "shuffle", &Config::data, &DataConfig::shuffle, "shuffle the data order (false: sequential)"),

      key("ckpt", "dir", &Config::ckpt, &CkptConfig::dir,
          "checkpoint directory: step_XXXXXXXX/ subdirectories and `latest` (empty: no checkpoints)"),
      key("ckpt", "every", &Config::ckpt, &CkptConfig::every,
          "steps between checkpoints; one is also saved at the end (0: only at the end)"),
      key("ckpt", "keep", &Config::ckpt, &CkptConfig::keep,
          "committed checkpoints to keep (0: all); the one resumed from is never deleted"),
      key("ckpt", "resume", &Config::ckpt, &CkptConfig::resume,
          "auto (the latest committed checkpoint in ckpt.dir, if any) | none | a step directory"),
      key("ckpt", "export", &Config::ckpt, &CkptConfig::export_path,
          "at the end, write the full weights to this HDF5 file with Hugging Face GPT-2 names (empty: none)"),

      key("init", "from", &Config::init, &InitConfig::from,
          "start from these weights instead of random init: .safetensors or .h5 with Hugging Face GPT-2 "
          "names (ignored when resuming a checkpoint)"),

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
          "cap on the device memory one rank may plan to use, in GiB (0: the card's free memory)"),
      key("dist", "timeout_s", &Config::dist, &DistConfig::timeout_s,
          "seconds one collective may take before the watchdog logs the op and ends the job with exit code 75 "
          "(a dead, stopped or hung rank); it must exceed the longest wait for a peer (a checkpoint save, "
          "the first step's planning). 0: no deadline"),
      key("dist", "bootstrap", &Config::dist, &DistConfig::bootstrap,
          "how ranks find each other: mpi (mpirun), env (WORLD_SIZE, RANK or JOB_COMPLETION_INDEX x LOCAL_WORLD_SIZE + "
          "LOCAL_RANK, MASTER_ADDR, MASTER_PORT: a TCP rendezvous on rank 0, as torchrun and Kubernetes Indexed Jobs "
          "give), auto (mpi under mpirun, else env when WORLD_SIZE is set, else one process); read before the "
          "command runs, from --config and --dist.* on the command line"),
      key("dist", "rendezvous_timeout_s", &Config::dist, &DistConfig::rendezvous_timeout_s,
          "dist.bootstrap=env: seconds the ranks wait for each other at start-up before failing (exit 75)"),
      key("dist", "prefetch_depth", &Config::dist, &DistConfig::prefetch_depth,
          "cuda: units whose parameter all-gather may run ahead of the unit computing, and gradient buffers whose "
          "reduce-scatter may run behind it (0: gather each unit just before use); each adds one unit's gathered "
          "parameters and gradient of memory. -1: the measured default for the sharding group's link (nvlink 1, "
          "pcie 2, network 1; the log says which). The cpu backend gathers synchronously and takes -1 only"),
      key("dist", "reduce_scatter_ctas", &Config::dist, &DistConfig::reduce_scatter_ctas,
          "cuda: the most CTAs (SMs) NCCL may run a block's gradient reduce-scatter on, through a communicator of "
          "its own; fewer leave more of the GPU to the backward it overlaps (the embedding's, which the next "
          "step waits for, keeps NCCL's choice). 0: NCCL's own choice for every reduce-scatter. -1: the measured "
          "default for the sharding group's link (nvlink 4, pcie 0, network 0; the log says which). The cpu "
          "backend takes -1 only"),
      key("dist", "gather_engine", &Config::dist, &DistConfig::gather_engine,
          "cuda: what moves the parameter all-gathers: copy (NCCL's copy engines, with no SM taken from the compute "
          "they overlap: the sharding group must be one node's GPUs on NVLink with peer-to-peer, and NCCL 2.28 or "
          "newer), sm (NCCL's kernels), or auto (copy where that holds, else sm; the log says which). The cpu "
          "backend takes auto only"),
      key("dist", "reduce_engine", &Config::dist, &DistConfig::reduce_engine,
          "cuda: what moves the gradient reduce-scatters: copy (each rank's slices go to their owners by NCCL's "
          "copy-engine all-to-all, and the owner adds them in rank order, in fp32, as it takes its shard: no NCCL "
          "kernel beside the backward; same conditions as dist.gather_engine = copy, and a unit-sized receive "
          "buffer), sm (NCCL's reduce-scatter kernels), or auto (copy where that holds and dist.reduce_scatter_ctas "
          "is not set, else sm; the log says which). The cpu "
          "backend takes auto only"),
      key("dist", "bucket_mb", &Config::dist, &DistConfig::bucket_mb,
          "hybrid sharding: the gradient shards of consecutive units are all-reduced across nodes together, once per "
          "optimizer step, as soon as this many MiB of them are final (0: one all-reduce per unit). -1: the measured "
          "default (0). Applies to dist.sharding hybrid and auto"),
  };
  return table;
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

// The hint after "unknown key 'x.y'": what the section does hold, or that there is no such section.
std::string unknown_key_hint(const std::string& full_name) {
  const auto dot = full_name.find('.');
  if (dot == std::string::npos) {
    return "every key belongs to a section: [section] in a file, --section.key on the command line; sections: " +
           section_list();
  }
  const std::string section = full_name.substr(0, dot);
  if (!is_section(section)) return "no section [" + section + "]; sections: " + section_list();
  std::string names;
  for (const auto& k : keys())
    if (section == k.section) names += (names.empty() ? "" : ", ") + std::string(k.name);
  if (names.empty()) return "section [" + section + "] has no keys in this version";
  return "keys of [" + section + "]: " + names;
}

po::options_description describe(Config& cfg) {
  po::options_description desc("shardtrain config");
  for (const auto& k : keys()) k.field->add_to(desc, k.full_name(), k.meaning, cfg);
  return desc;
}

// ---------------------------------------------------------------------------------------------------
// INI text. Boost reads the file; this scanner mirrors its grammar only to report line numbers and to
// refuse unknown or empty sections, which Boost accepts silently when no key follows them.

struct IniLine {
  enum class Kind { kBlank, kSection, kKey, kMalformed };
  int number = 0;
  Kind kind = Kind::kBlank;
  std::string text;  // the line without its comment, trimmed
  std::string name;  // section name, or section.key as Boost will see it
};

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const auto b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::vector<IniLine> scan_ini(const std::string& text) {
  std::vector<IniLine> out;
  std::istringstream in(text);
  std::string raw;
  std::string prefix;
  int number = 0;
  while (std::getline(in, raw)) {
    IniLine line;
    line.number = ++number;
    line.text = trim(raw.substr(0, raw.find('#')));
    if (line.text.empty()) {
      line.kind = IniLine::Kind::kBlank;
    } else if (line.text.front() == '[' && line.text.back() == ']') {
      line.kind = IniLine::Kind::kSection;
      line.name = line.text.substr(1, line.text.size() - 2);
      prefix = line.name.empty() || line.name.back() != '.' ? line.name + "." : line.name;
    } else if (const auto eq = line.text.find('='); eq != std::string::npos) {
      line.kind = IniLine::Kind::kKey;
      line.name = prefix + trim(line.text.substr(0, eq));
    } else {
      line.kind = IniLine::Kind::kMalformed;
    }
    out.push_back(std::move(line));
  }
  return out;
}

std::vector<int> lines_of_key(const std::vector<IniLine>& lines, const std::string& full_name) {
  std::vector<int> out;
  for (const auto& l : lines)
    if (l.kind == IniLine::Kind::kKey && l.name == full_name) out.push_back(l.number);
  return out;
}

// Boost names command-line options as typed ("--train.stepz=5"); we name keys as written in INI.
std::string bare_key(std::string name) {
  name.erase(0, name.find_first_not_of('-'));
  return name.substr(0, name.find('='));
}

std::vector<std::string> raw_values(const po::parsed_options& parsed, const std::string& full_name) {
  std::vector<std::string> out;
  for (const auto& opt : parsed.options)
    if (opt.string_key == full_name) out.push_back(opt.value.empty() ? std::string() : opt.value.front());
  return out;
}

// Where a parse happens: a file (with its lines, for line numbers) or the command line.
struct Source {
  std::string label;                  // "config file configs/x.ini" or "command line"
  const std::vector<IniLine>* lines;  // null for the command line

  // "config file x.ini:3" for the first line that sets `full_name`, else just the label.
  std::string at(const std::string& full_name) const {
    if (lines == nullptr) return label;
    const auto found = lines_of_key(*lines, full_name);
    return found.empty() ? label : label + ":" + std::to_string(found.front());
  }
};

[[noreturn]] void throw_bad_value(const Source& src, const std::string& full_name, const std::string& raw) {
  const Key* k = find_key(full_name);
  ST_BAD_INPUT(src.at(full_name), ": bad value '", raw, "' for ", full_name, " (expected ",
               (k != nullptr ? k->field->expected() : std::string("a valid value")), ")");
}

// Stores `parsed` into the fields bound in its description, turning Boost's errors into ours.
void store_into_config(const po::parsed_options& parsed, const Source& src) {
  for (const auto& opt : parsed.options) {
    const Key* k = find_key(opt.string_key);
    const std::string raw = opt.value.empty() ? std::string() : opt.value.front();
    if (k != nullptr && k->field->rejects(raw)) throw_bad_value(src, opt.string_key, raw);
  }
  po::variables_map vm;
  try {
    po::store(parsed, vm);
    po::notify(vm);
  } catch (const po::multiple_occurrences& e) {
    const std::string name = bare_key(e.get_option_name());
    std::string where;
    if (src.lines != nullptr) {
      for (int line : lines_of_key(*src.lines, name)) where += (where.empty() ? "lines " : ", ") + std::to_string(line);
    } else {
      for (const auto& v : raw_values(parsed, name)) where += (where.empty() ? "values '" : "', '") + v;
      where += "'";
    }
    ST_BAD_INPUT(src.label, ": ", name, " is set more than once (", where, ")");
  } catch (const po::validation_error& e) {
    const std::string name = bare_key(e.get_option_name());
    const auto values = raw_values(parsed, name);
    throw_bad_value(src, name, values.empty() ? std::string() : values.front());
  } catch (const po::error& e) {
    ST_BAD_INPUT(src.label, ": ", e.what());
  }
}

std::string read_config_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) ST_BAD_INPUT("config file '", path, "' does not exist");
  if (std::filesystem::is_directory(path, ec)) ST_BAD_INPUT("config file '", path, "' is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) ST_BAD_INPUT("config file '", path, "' cannot be opened: ", std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) ST_BAD_INPUT("config file '", path, "' cannot be read: ", std::strerror(errno));
  return text.str();
}

// `label` names the text in errors: "config file PATH", or where else the INI came from.
void apply_text(const std::string& text, const std::string& label, const po::options_description& desc) {
  const std::vector<IniLine> lines = scan_ini(text);
  const Source src{label, &lines};
  for (const auto& l : lines) {
    const std::string at = src.label + ":" + std::to_string(l.number);
    if (l.kind == IniLine::Kind::kMalformed)
      ST_BAD_INPUT(at, ": malformed line '", l.text, "' (expected [section], key = value, or a # comment)");
    if (l.kind == IniLine::Kind::kSection && !is_section(l.name))
      ST_BAD_INPUT(at, ": unknown section [", l.name, "] (sections: ", section_list(), ")");
  }

  std::istringstream in(text);
  std::optional<po::parsed_options> parsed;
  try {
    parsed.emplace(po::parse_config_file(in, desc, /*allow_unregistered=*/false));
  } catch (const po::unknown_option& e) {
    const std::string name = bare_key(e.get_option_name());
    ST_BAD_INPUT(src.at(name), ": unknown key '", name, "' (", unknown_key_hint(name), ")");
  } catch (const po::invalid_config_file_syntax& e) {
    // scan_ini() should have caught it first; keep Boost's text, which quotes the line.
    ST_BAD_INPUT(src.label, ": malformed line: ", e.what());
  } catch (const po::error& e) {
    ST_BAD_INPUT(src.label, ": ", e.what());
  }
  store_into_config(*parsed, src);
}

void apply_overrides(const std::vector<std::string>& overrides, const po::options_description& desc) {
  const Source src{"command line", nullptr};
  // Long options only, never guessed from a prefix: --train.step must not silently mean --train.steps.
  const int style = po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent |
                    po::command_line_style::long_allow_next;
  // Boost refuses "--key=" (an empty adjacent value); "--log.metrics=" is how one clears a string key, so
  // hand it over as "--key" "" instead.
  std::vector<std::string> args;
  for (const auto& arg : overrides) {
    if (arg.size() > 3 && arg.compare(0, 2, "--") == 0 && arg.find('=') == arg.size() - 1) {
      args.push_back(arg.substr(0, arg.size() - 1));
      args.emplace_back();
    } else {
      args.push_back(arg);
    }
  }
  std::optional<po::parsed_options> parsed;
  try {
    parsed.emplace(po::command_line_parser(args).options(desc).style(style).run());
  } catch (const po::unknown_option& e) {
    const std::string name = bare_key(e.get_option_name());
    ST_BAD_INPUT(src.label, ": unknown key '", name, "' in '", e.get_option_name(), "' (", unknown_key_hint(name), ")");
  } catch (const po::invalid_command_line_syntax& e) {
    const std::string name = bare_key(e.get_option_name());
    const std::string usage = "write --" + (name.empty() ? std::string("section.key") : name) + "=VALUE";
    if (e.kind() == po::invalid_command_line_syntax::missing_parameter)
      ST_BAD_INPUT(src.label, ": ", name, " needs a value (", usage, ")");
    ST_BAD_INPUT(src.label, ": ", e.what(), " (", usage, ")");
  } catch (const po::error& e) {
    ST_BAD_INPUT(src.label, ": ", e.what(), " (overrides are --section.key=value)");
  }
  // Boost keeps words that are not options as positional arguments and store() drops them silently.
  for (const auto& opt : parsed->options) {
    if (opt.string_key.empty()) {
      const std::string word = opt.original_tokens.empty() ? std::string() : opt.original_tokens.front();
      ST_BAD_INPUT(src.label, ": unexpected argument '", word, "' (overrides are --section.key=value)");
    }
  }
  store_into_config(*parsed, src);
}

// ---------------------------------------------------------------------------------------------------
// Cross-key validation, after file and overrides are merged. Collects every problem so one run of a
// bad config shows all of them.

std::vector<std::string> check(const Config& c) {
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
    if (!ok) add(name, " must be ", want, " (got ", format_value(v), ")");
  };

  positive("model.n_layer", c.model.n_layer);
  positive("model.n_head", c.model.n_head);
  positive("model.n_embd", c.model.n_embd);
  positive("model.vocab_size", c.model.vocab_size);
  positive("model.seq_len", c.model.seq_len);
  if (c.model.n_head > 0 && c.model.n_embd > 0 && c.model.n_embd % c.model.n_head != 0)
    add("model.n_embd (", c.model.n_embd, ") must be a multiple of model.n_head (", c.model.n_head, ")");

  positive("train.steps", c.train.steps);
  positive("train.global_batch", c.train.global_batch);
  positive("train.micro_batch", c.train.micro_batch);
  at_least("train.eval_every", c.train.eval_every, 0);
  at_least("train.eval_batches", c.train.eval_batches, 1);
  at_least("train.sample_tokens", c.train.sample_tokens, 0);

  const auto& o = c.optim;
  float_check("optim.lr", o.lr, o.lr > 0 && std::isfinite(o.lr), "finite and > 0");
  if (!(o.min_lr >= 0 && o.min_lr <= o.lr))
    add("optim.min_lr (", format_value(o.min_lr), ") must be in [0, optim.lr] = [0, ", format_value(o.lr), "]");
  at_least("optim.warmup_steps", o.warmup_steps, 0);
  float_check("optim.weight_decay", o.weight_decay, o.weight_decay >= 0, ">= 0");
  float_check("optim.beta1", o.beta1, o.beta1 >= 0 && o.beta1 < 1, "in [0, 1)");
  float_check("optim.beta2", o.beta2, o.beta2 >= 0 && o.beta2 < 1, "in [0, 1)");
  float_check("optim.eps", o.eps, o.eps > 0, "> 0");
  float_check("optim.grad_clip", o.grad_clip, o.grad_clip >= 0, ">= 0 (0: off)");
  at_least("optim.offload_threads", o.offload_threads, 0);
  float_check("optim.offload_fraction", o.offload_fraction, o.offload_fraction > 0 && o.offload_fraction <= 1,
              "in (0, 1]");
  if (o.offload == OffloadMode::kNone && o.offload_fraction != 1.0f)
    add("optim.offload_fraction (", format_value(o.offload_fraction), ") needs optim.offload optimizer or "
        "optimizer+params (it is none)");
  if (o.offload_speculative == Speculation::kOn && (c.train.device != Device::kCuda || o.offload == OffloadMode::kNone))
    add("optim.offload_speculative (true) needs train.device=cuda and optim.offload optimizer or optimizer+params "
        "(they are ", to_string(c.train.device), " and ", to_string(o.offload), ")");
  if (c.train.device == Device::kCuda && o.offload != OffloadMode::kNone && c.compute_dtype() == DType::kF32)
    add("optim.offload (", to_string(o.offload), ") needs train.dtype bf16 or fp16 on cuda (the host AdamW writes "
        "the half-precision shard the GPU gathers)");
  if (c.train.device == Device::kCpu && o.offload == OffloadMode::kOptimizerParams)
    add("optim.offload (optimizer+params) applies to train.device=cuda; on cpu the parameters are in host memory "
        "already (optimizer runs the host AdamW threads)");

  if (c.data.path.empty()) add("data.path must not be empty");
  float_check("data.val_holdout", c.data.val_holdout, c.data.val_holdout >= 0 && c.data.val_holdout < 1, "in [0, 1)");

  at_least("ckpt.every", c.ckpt.every, 0);
  at_least("ckpt.keep", c.ckpt.keep, 0);
  if (c.ckpt.resume.empty()) add("ckpt.resume must be auto, none, or a checkpoint directory (got an empty value)");

  at_least("log.every", c.log.every, 1);
  if (c.train.device == Device::kCpu && c.train.dtype != DType::kF32 && c.train.dtype != DType::kAuto)
    add("train.dtype (", to_string(c.train.dtype), ") must be fp32 when train.device is cpu");
  if (c.train.device == Device::kCpu && c.train.attention != AttentionImpl::kAuto)
    add("train.attention (", to_string(c.train.attention), ") applies to train.device=cuda; cpu takes auto");
  if (c.train.attention == AttentionImpl::kCudnn && c.compute_dtype() == DType::kF32)
    add("train.attention (cudnn) needs train.dtype bf16 or fp16 (cuDNN's fused attention has no fp32 engine)");
  float_check("dist.timeout_s", c.dist.timeout_s, c.dist.timeout_s >= 0 && std::isfinite(c.dist.timeout_s),
              ">= 0 (0: no deadline)");
  float_check("dist.rendezvous_timeout_s", c.dist.rendezvous_timeout_s,
              c.dist.rendezvous_timeout_s > 0 && std::isfinite(c.dist.rendezvous_timeout_s), "finite and > 0");
  float_check("dist.max_gpu_mem_gib", c.dist.max_gpu_mem_gib,
              c.dist.max_gpu_mem_gib >= 0 && std::isfinite(c.dist.max_gpu_mem_gib), ">= 0 (0: no cap)");
  if (c.dist.prefetch_depth < -1 || c.dist.prefetch_depth > kMaxPrefetchDepth)
    add("dist.prefetch_depth (", c.dist.prefetch_depth, ") must be -1 (the link's default) or in [0, ",
        kMaxPrefetchDepth, "]");
  if (c.dist.reduce_scatter_ctas < -1 || c.dist.reduce_scatter_ctas > kMaxNcclCtas)
    add("dist.reduce_scatter_ctas (", c.dist.reduce_scatter_ctas,
        ") must be -1 (the link's default), 0 (NCCL's "
        "own) or in [1, ",
        kMaxNcclCtas, "]");
  if (c.train.device == Device::kCpu && !c.train.deterministic)
    add("train.deterministic (false) applies to train.device=cuda; the cpu backend is deterministic and takes true "
        "only");
  if (c.train.device == Device::kCpu && c.dist.gather_engine != CommEngine::kAuto)
    add("dist.gather_engine (", to_string(c.dist.gather_engine),
        ") applies to train.device=cuda (NCCL); the cpu "
        "backend takes auto only");
  if (c.train.device == Device::kCpu && c.dist.reduce_engine != CommEngine::kAuto)
    add("dist.reduce_engine (", to_string(c.dist.reduce_engine),
        ") applies to train.device=cuda (NCCL); the cpu backend takes auto only");
  if (c.train.device == Device::kCpu && c.dist.reduce_scatter_ctas != -1)
    add("dist.reduce_scatter_ctas (", c.dist.reduce_scatter_ctas,
        ") applies to train.device=cuda (NCCL); the cpu "
        "backend takes -1 only");
  if (c.train.gemm_autotune < 0 || c.train.gemm_autotune > kMaxGemmCandidates)
    add("train.gemm_autotune (", c.train.gemm_autotune, ") must be in [0, ", kMaxGemmCandidates, "]");
  if (c.train.device == Device::kCpu && c.train.gemm_autotune != 0)
    add("train.gemm_autotune (", c.train.gemm_autotune, ") applies to train.device=cuda (cuBLASLt); the cpu backend "
        "takes 0 only");
  if (c.train.device == Device::kCpu && c.dist.prefetch_depth != -1)
    add("dist.prefetch_depth (", c.dist.prefetch_depth, ") applies to train.device=cuda; the cpu backend gathers "
        "each unit when it is needed and takes -1 only");
  float_check("dist.bucket_mb", c.dist.bucket_mb,
              std::isfinite(c.dist.bucket_mb) && (c.dist.bucket_mb == -1 || c.dist.bucket_mb >= 0),
              "-1 (the default) or >= 0 (0: one all-reduce per unit)");
  if (c.dist.sharding == ShardingMode::kFull && c.dist.bucket_mb != -1)
    add("dist.bucket_mb (", format_value(c.dist.bucket_mb), ") applies to dist.sharding hybrid or auto (it is full: "
        "no all-reduce across nodes)");

  // to_ini() must be able to write every value back: INI values are trimmed and '#' starts a comment.
  for (const auto& k : keys()) {
    const std::string v = k.field->format(c);
    if (v.find_first_of("#\r\n") != std::string::npos || (!v.empty() && trim(v) != v))
      add(k.full_name(), " ('", v, "') cannot be written to INI: no '#', line breaks, or leading/trailing spaces");
  }
  return problems;
}

}  // namespace

DType Config::compute_dtype() const {
  if (train.dtype != DType::kAuto) return train.dtype;
  return train.device == Device::kCuda ? DType::kBF16 : DType::kF32;
}

int64_t Config::grad_accum_steps(int world_size) const {
  if (world_size <= 0) ST_BAD_INPUT("world size (", world_size, ") must be > 0");
  const int64_t per_micro_step = train.micro_batch * world_size;
  if (train.global_batch <= 0 || train.micro_batch <= 0 || train.global_batch % per_micro_step != 0) {
    ST_BAD_INPUT("train.global_batch (", train.global_batch, ") must be a multiple of train.micro_batch (",
                 train.micro_batch, ") x world size (", world_size, ") = ", per_micro_step,
                 (source.empty() ? std::string() : " (config " + source + ")"));
  }
  return train.global_batch / per_micro_step;
}

namespace {

// Parses an optional INI text (labelled for errors), then the overrides, then validates.
Config load(const std::optional<std::string>& text, const std::string& label, const std::string& source,
            const std::vector<std::string>& overrides) {
  Config cfg;
  cfg.source = source;
  {
    // The description holds pointers into cfg; it must not outlive this scope.
    const po::options_description desc = describe(cfg);
    if (text) apply_text(*text, label, desc);
    if (!overrides.empty()) apply_overrides(overrides, desc);
  }
  const auto problems = check(cfg);
  if (!problems.empty()) {
    std::string joined;
    for (const auto& p : problems) joined += (joined.empty() ? "" : "; ") + p;
    ST_BAD_INPUT("config ", cfg.source, (overrides.empty() ? "" : " with command-line overrides"), ": ", joined);
  }
  return cfg;
}

}  // namespace

Config load_config(const std::optional<std::string>& path, const std::vector<std::string>& overrides) {
  if (!path) return load(std::nullopt, "", "<defaults>", overrides);
  return load(read_config_file(*path), "config file " + *path, *path, overrides);
}

Config load_config_text(const std::string& ini_text, const std::string& label,
                        const std::vector<std::string>& overrides) {
  return load(ini_text, label, label, overrides);
}

std::string config_help() {
  const Config defaults;
  size_t name_width = 0;
  size_t default_width = 0;
  for (const auto& k : keys()) {
    name_width = std::max(name_width, k.full_name().size());
    default_width = std::max(default_width, k.field->format(defaults).size());
  }
  std::ostringstream os;
  for (const char* section : kSections) {
    os << "[" << section << "]\n";
    bool any = false;
    for (const auto& k : keys()) {
      if (std::strcmp(k.section, section) != 0) continue;
      any = true;
      std::string value = k.field->format(defaults);
      if (value.empty()) value = "\"\"";
      os << "  " << std::left << std::setw(static_cast<int>(name_width)) << k.full_name() << "  "
         << std::setw(static_cast<int>(default_width + 11)) << ("(default: " + value + ")") << "  " << k.meaning
         << "\n";
    }
    if (!any) os << "  (no keys in this version)\n";
  }
  return os.str();
}

std::string to_ini(const Config& cfg) {
  std::ostringstream os;
  os << "# shardtrain config: every key with its value\n";
  for (const char* section : kSections) {
    os << "\n[" << section << "]\n";
    bool any = false;
    for (const auto& k : keys()) {
      if (std::strcmp(k.section, section) != 0) continue;
      any = true;
      const std::string value = k.field->format(cfg);
      os << k.name << " =" << (value.empty() ? "" : " ") << value << "\n";
    }
    if (!any) os << "# no keys in this version\n";
  }
  return os.str();
}

}  // namespace st
