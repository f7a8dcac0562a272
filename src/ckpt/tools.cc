#include "shardtrain/ckpt/tools.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <vector>

#include "export_parts.h"
#include "shardtrain/ckpt/checkpoint_check.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/ckpt/gpt2_file.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/ckpt/lora_base.h"
#include "shardtrain/ckpt/safetensors.h"
#include "shardtrain/ckpt/shard_file.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/hf_config.h"
#include "shardtrain/core/new_file.h"
#include "shardtrain/model/llama/llama_hf.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/units.h"

namespace fs = std::filesystem;

namespace st {
namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// The temporary name a writer uses beside `path`: a name of its own (its pid), so it never takes another run's or the
// user's file for its own.
std::string temporary_beside(const std::string& path) { return path + ".tmp-" + std::to_string(::getpid()); }

}  // namespace

namespace ckpt_internal {

void ParamGather::read(const UnitLayout& u, ShardSpan want, float* out) {
  int64_t filled = 0;
  for (int r = 0; r < m_.world_size; ++r) {
    const ShardSpan part = intersect(want, m_.files[static_cast<size_t>(r)].spans[static_cast<size_t>(u.index)]);
    if (part.count == 0) continue;
    reader(r).read(u.name, ShardState::kParam, part, out + (part.offset - want.offset));
    filled += part.count;
  }
  // read_manifest checked that the spans cover each unit exactly once.
  ST_ENFORCE_EQ(filled, want.count);
}

const ShardFileReader& ParamGather::reader(int r) {
  auto it = readers_.find(r);
  if (it != readers_.end()) return *it->second;
  return *readers_.emplace(r, std::make_unique<ShardFileReader>(open_rank_file(step_dir_, m_, r))).first->second;
}

NewDirectory::NewDirectory(std::string dir, std::string what) : dir_(std::move(dir)), what_(std::move(what)) {
  // "out/" and "out" are the same directory; its parent must exist. Every file is new: the directory is new or
  // empty.
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  check_output_dir(dir_, what_);
  std::error_code ec;
  exists_ = path_exists(dir_);
  if (exists_ && (!fs::is_directory(fs::symlink_status(dir_, ec)) || !fs::is_empty(dir_, ec)))
    ST_BAD_INPUT(what_, " ", dir_, ": exists and is ",
                 fs::is_directory(fs::symlink_status(dir_, ec)) ? "not empty" : "not a directory",
                 "; shardtrain writes only new files: name a new directory (or an empty one)");
  // A directory of this run's own: a killed export's (another pid) stays, and is never taken for this one.
  tmp_ = temporary_beside(dir_);
  if (!fs::create_directory(tmp_, ec)) ST_FAULT("cannot create ", tmp_, ": ", ec ? ec.message() : "it exists");
}

NewDirectory::~NewDirectory() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

std::string NewDirectory::file(const std::string& name) const { return (fs::path(tmp_) / name).string(); }

void NewDirectory::commit() {
  fsync_path(tmp_);
  if (exists_) {
    // rename(2) replaces an empty directory, and fails on one that files were put in meanwhile.
    if (std::rename(tmp_.c_str(), dir_.c_str()) != 0) {
      if (errno == ENOTEMPTY || errno == EEXIST)
        ST_BAD_INPUT(what_, " ", dir_,
                     ": files appeared in it while the export was written; nothing was replaced: name a new "
                     "directory");
      ST_FAULT("cannot rename ", tmp_, " to ", dir_, ": ", errno_text());
    }
    const fs::path parent = fs::path(dir_).parent_path();
    fsync_path(parent.empty() ? "." : parent.string());
  } else {
    commit_new_file(tmp_, dir_, what_);
  }
  committed_ = true;
}

}  // namespace ckpt_internal

using ckpt_internal::NewDirectory;
using ckpt_internal::ParamGather;

std::string inspect_checkpoint(const std::string& step_dir) {
  const Manifest m = open_checkpoint(step_dir);
  std::ostringstream os;
  os << "checkpoint " << step_dir << "\n"
     << "step " << m.step << "\n"
     << "world_size " << m.world_size << "\n"
     << "format_version " << m.format_version << "\n"
     << "optimizer_updates " << m.optimizer_updates << "\n"
     << "data_cursor " << m.data_cursor << "\n"
     << "model arch=" << to_string(m.model.arch) << " n_layer=" << m.model.n_layer << " n_head=" << m.model.n_head
     << " n_embd=" << m.model.n_embd << " vocab_size=" << m.model.vocab_size << " seq_len=" << m.model.seq_len;
  if (m.model.is_llama()) os << " n_kv_head=" << m.model.kv_heads() << " ffn_dim=" << m.model.ffn_dim;
  os << "\n";
  // A LoRA checkpoint holds the adapters; the base it applies to is named, not stored.
  const LoraConfig& l = m.model.lora;
  if (l.enabled()) {
    os << "lora rank=" << l.rank << " alpha=" << l.alpha << " targets=" << l.targets
       << " rslora=" << (l.rslora ? "true" : "false") << " dropout=" << l.dropout
       << " base_dtype=" << to_string(l.base_dtype) << "\n";
    if (m.base.init_from.empty())
      os << "lora base: drawn from train.seed " << m.seed << "\n";
    else
      os << "lora base: init.from " << m.base.init_from << "\n";
    for (const ManifestBaseFile& f : m.base.files) os << "  " << f.name << " sha256=" << f.sha256 << "\n";
  }
  os << "units " << m.units.size() << "\n";
  for (const ManifestUnit& u : m.units) {
    os << "  " << u.name << " numel=" << u.numel << "\n";
    for (const ManifestTensor& t : u.tensors) os << "    " << t.name << " " << shape_text(t.shape) << "\n";
  }
  int64_t total = 0;
  for (const ManifestFile& f : m.files) total += f.bytes;
  os << "files " << m.files.size() << " bytes=" << total << "\n";
  for (const ManifestFile& f : m.files)
    os << "  " << f.name << " bytes=" << f.bytes << " " << digest_field(m) << "=" << f.digest << "\n";
  return os.str();
}

VerifyReport verify_checkpoint(const std::string& step_dir) {
  const Manifest m = open_checkpoint(step_dir);
  VerifyReport report;
  for (int file : files_held(m)) {
    const ManifestFile& f = m.files[static_cast<size_t>(file)];
    open_rank_file(step_dir, m, f.rank);
    ++report.files;
    report.bytes += f.bytes;
  }
  if (m.node_local) {
    report.node_local = true;
    report.node = m.node_local->node;
    report.nodes = m.node_local->nodes;
    const std::vector<int> held = files_held(m);
    for (const ManifestFile& f : m.files) {
      const auto in = [&](const std::vector<int>& v) { return std::find(v.begin(), v.end(), f.rank) != v.end(); };
      (in(m.node_local->primaries)  ? report.primaries
       : in(m.node_local->replicas) ? report.replicas
                                    : report.elsewhere)
          .push_back(f.name);
    }
  }
  return report;
}

std::optional<ExportFormat> export_format_for(const std::string& path) {
  auto ends_with = [&](const std::string& suffix) {
    return path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (ends_with(".safetensors")) return ExportFormat::kSafetensors;
  if (ends_with(".h5")) return ExportFormat::kHdf5;
  return std::nullopt;
}

std::string hf_gpt2_config_json(const ModelConfig& model) {
  nlohmann::ordered_json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = model.vocab_size;
  j["n_positions"] = model.seq_len;
  j["n_ctx"] = model.seq_len;
  j["n_embd"] = model.n_embd;
  j["n_layer"] = model.n_layer;
  j["n_head"] = model.n_head;
  j["n_inner"] = nullptr;  // 4 * n_embd
  j["activation_function"] = "gelu_new";
  j["layer_norm_epsilon"] = 1e-05;
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["attn_pdrop"] = 0.0;
  j["initializer_range"] = 0.02;
  j["tie_word_embeddings"] = true;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

ExportReport export_checkpoint(const std::string& step_dir, const std::string& out_path) {
  const std::optional<ExportFormat> format = export_format_for(out_path);
  if (!format) ST_BAD_INPUT("output path ", out_path, " must end in .safetensors or .h5");
  const fs::path out_dir = fs::path(out_path).parent_path().empty() ? fs::path(".") : fs::path(out_path).parent_path();
  check_output_dir(out_path, "ckpt export --out");
  // Both files are new: the weights at --out, and the config.json beside them.
  refuse_existing(out_path, "ckpt export --out");
  const std::string config_path = (out_dir / "config.json").string();
  if (path_exists(config_path))
    ST_BAD_INPUT("ckpt export --out ", out_path, ": ", config_path,
                 " exists, and the export writes GPT2Config's config.json beside the weights; shardtrain writes only "
                 "new files: remove it, or export into another directory");

  const Manifest m = open_checkpoint(step_dir);
  if (m.model.is_llama())
    ST_BAD_INPUT("ckpt export ", step_dir,
                 ": a llama checkpoint is exported as a Hugging Face model directory: --out "
                 "names the directory (",
                 out_path, " ends in a file suffix)");
  const std::vector<UnitLayout> units = build_units(m.model);
  const std::vector<HfTensorMap> map = hf_gpt2_tensor_map(m.model, units);

  ParamGather gather(step_dir, m);

  // One HF tensor: the elements [offset, offset + numel) of its unit (wte: its first vocab_size rows, which
  // are contiguous), gathered from the rank files, then transposed for Conv1D.
  std::vector<float> buf, scratch;
  // A LoRA checkpoint: each tensor is its base's (the manifest's init.from, checked against the digests it recorded)
  // with the adapters of the tensor merged in, in shardtrain's layout before the Conv1D transpose.
  std::unique_ptr<Gpt2File> base;
  if (m.model.lora.enabled()) base = std::make_unique<Gpt2File>(lora_base_to_merge(m, step_dir));
  std::vector<float> a, b;
  auto load = [&](const HfTensorMap& t) -> const float* {
    const UnitLayout& u = units[static_cast<size_t>(t.unit)];
    const ShardSpan want{t.tensor->offset, numel_of(t.hf_shape)};
    buf.resize(static_cast<size_t>(want.count));
    if (!base) {
      gather.read(u, want, buf.data());
    } else {
      scratch.resize(buf.size());
      base->read(base->resolve(t.hf_name), t.hf_shape, t.transpose ? scratch.data() : buf.data());
      if (t.transpose) transpose_2d(scratch.data(), buf.data(), t.hf_shape[0], t.hf_shape[1]);  // to [out, in]
      for (const LoraAdapter& ad : lora_adapters(u, m.model)) {
        if (ad.linear.weight != t.tensor->name) continue;
        a.resize(static_cast<size_t>(ad.rank * ad.linear.in));
        b.resize(static_cast<size_t>(ad.linear.rows * ad.rank));
        gather.read(u, ShardSpan{ad.a_offset, static_cast<int64_t>(a.size())}, a.data());
        gather.read(u, ShardSpan{ad.b_offset, static_cast<int64_t>(b.size())}, b.data());
        add_lora_delta(buf.data() + ad.linear.row0 * ad.linear.in, a.data(), b.data(), ad.linear.rows, ad.linear.in,
                       ad.rank, lora_scale(m.model.lora));
      }
    }
    if (!t.transpose) return buf.data();
    scratch.resize(buf.size());
    transpose_2d(buf.data(), scratch.data(), t.tensor->shape[0], t.tensor->shape[1]);
    return scratch.data();
  };

  ExportReport report;
  report.path = out_path;
  report.config_path = config_path;
  report.tensors = static_cast<int>(map.size());
  // Written beside the target and renamed into place; a failed write removes it, so neither a temporary nor a
  // half-written file at out_path is left.
  const std::string tmp = temporary_beside(out_path);
  RemoveOnFailure guard(tmp);
  if (*format == ExportFormat::kSafetensors) {
    std::vector<SafetensorsTensor> decl;
    for (const HfTensorMap& t : map) decl.push_back({t.hf_name, t.hf_shape});
    SafetensorsWriter w(tmp, std::move(decl));
    for (const HfTensorMap& t : map) w.write(t.hf_name, load(t), numel_of(t.hf_shape));
    w.finish();
  } else {
    H5File f = H5File::create(tmp);
    for (const HfTensorMap& t : map) h5_write_f32(f, t.hf_name, t.hf_shape, load(t));
    f.close();
    fsync_path(tmp);  // HDF5 never fsyncs
  }
  guard.dismiss();
  commit_new_file(tmp, out_path, "ckpt export --out");
  report.bytes = file_size(out_path);
  // The export is the pair: weights without their config are removed again.
  RemoveOnFailure weights(out_path);
  write_new_file_atomic(config_path, hf_gpt2_config_json(base_model(m.model)),
                        "ckpt export --out " + out_path + ": the config");
  weights.dismiss();
  return report;
}

}  // namespace st

namespace st {

HfDirExportReport export_checkpoint_hf_dir(const std::string& step_dir, const std::string& out_dir,
                                           const HfDirExportOptions& options) {
  if (options.max_shard_bytes <= 0)
    ST_BAD_INPUT("ckpt export: --max-shard-size must be > 0 bytes (got ", options.max_shard_bytes, ")");
  const Manifest m = open_checkpoint(step_dir);
  if (!m.model.is_llama())
    ST_BAD_INPUT("ckpt export ", step_dir, ": this checkpoint is model.arch=", to_string(m.model.arch), ": --out ",
                 out_dir,
                 " must be a file with an allowed suffix (allowed: .safetensors, .h5); a Hugging Face model "
                 "directory is written for llama checkpoints");
  NewDirectory out(out_dir, "ckpt export --out");
  const std::vector<UnitLayout> units = build_units(m.model);
  const std::vector<HfRange> map = llama_hf_tensor_map(m.model, units);

  // Files: tensors in map order, a new file when the next tensor would take the current one past the limit
  // (Hugging Face's rule: a tensor larger than the limit gets a file of its own).
  std::vector<std::vector<SafetensorsTensor>> files;
  int64_t in_file = 0, total = 0;
  for (const HfRange& r : map) {
    const SafetensorsTensor t{r.hf_name, r.hf_shape, options.dtype};
    const int64_t bytes = safetensors_bytes(t);
    if (files.empty() || (in_file > 0 && in_file + bytes > options.max_shard_bytes)) {
      files.emplace_back();
      in_file = 0;
    }
    files.back().push_back(t);
    in_file += bytes;
    total += bytes;
  }
  auto file_name = [&](size_t i) {
    if (files.size() == 1) return std::string("model.safetensors");
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", i + 1, files.size());
    return std::string(name);
  };

  HfDirExportReport report;
  report.dir = out.dir();
  report.tensors = static_cast<int>(map.size());
  report.files = static_cast<int>(files.size());
  ckpt_internal::LlamaExportValues values(step_dir, m, units);
  std::vector<float> buf;
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  size_t next = 0;  // index into map
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string name = file_name(i);
    SafetensorsWriter w(out.file(name), files[i]);
    for (const SafetensorsTensor& t : files[i]) {
      const HfRange& r = map[next++];
      buf.resize(static_cast<size_t>(r.numel));
      values.read(r, buf.data());
      w.write(t.name, buf.data(), r.numel);
      weight_map[t.name] = name;
    }
    w.finish();
    report.bytes += w.file_bytes();
  }
  if (files.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = weight_map;
    write_file_atomic(out.file("model.safetensors.index.json"), index.dump(2) + "\n");
  }
  write_file_atomic(
      out.file("config.json"),
      hf_llama_config_json(base_model(m.model), options.dtype == SafetensorsDtype::kBF16 ? "bfloat16" : "float32"));
  out.commit();
  return report;
}

}  // namespace st
