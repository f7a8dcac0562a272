#include "shardtrain/ckpt/manifest.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <locale>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "shardtrain/ckpt/digest.h"
#include "shardtrain/ckpt/file_io.h"
#include "shardtrain/core/error.h"

namespace st {
namespace {

using json = nlohmann::json;
// Written in declaration order so the file reads top-down like the struct.
using ordered_json = nlohmann::ordered_json;

std::string join(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}
std::string index(const std::string& array, size_t i) { return array + "[" + std::to_string(i) + "]"; }

std::string span_text(const ShardSpan& s) { return str_cat("[", s.offset, ", ", s.end(), ")"); }

// Reads typed fields out of parsed JSON. Every error names the manifest path and the field's full path
// (e.g. files[1].sha256), the type or range expected, and what was found.
class FieldReader {
 public:
  explicit FieldReader(const std::string& path) : path_(path) {}
  const std::string& path() const { return path_; }

  const json& field(const json& obj, const std::string& parent, const char* key) const {
    const auto it = obj.find(key);
    if (it == obj.end()) ST_BAD_INPUT(path_, ": required field ", join(parent, key), " is missing");
    return *it;
  }

  const json& object(const json& v, const std::string& name) const {
    if (!v.is_object()) wrong_type(v, name, "an object");
    return v;
  }
  const json& array(const json& v, const std::string& name) const {
    if (!v.is_array()) wrong_type(v, name, "an array");
    return v;
  }
  std::string string(const json& v, const std::string& name) const {
    if (!v.is_string()) wrong_type(v, name, "a string");
    return v.get<std::string>();
  }
  bool boolean(const json& v, const std::string& name) const {
    if (!v.is_boolean()) wrong_type(v, name, "true or false");
    return v.get<bool>();
  }
  double number(const json& v, const std::string& name) const {
    if (!v.is_number()) wrong_type(v, name, "a number");
    return v.get<double>();
  }
  int64_t i64(const json& v, const std::string& name) const {
    if (!v.is_number_integer()) wrong_type(v, name, "an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      ST_BAD_INPUT(path_, ": ", name, " is ", v.dump(), ", expected at most ", std::numeric_limits<int64_t>::max());
    return v.get<int64_t>();
  }
  int i32(const json& v, const std::string& name) const {
    const int64_t x = i64(v, name);
    if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max())
      ST_BAD_INPUT(path_, ": ", name, " is ", x, ", expected a 32-bit integer");
    return static_cast<int>(x);
  }
  uint64_t u64(const json& v, const std::string& name) const {
    // nlohmann stores every non-negative integer literal as unsigned, so this admits 0 .. 2^64-1.
    if (!v.is_number_unsigned()) wrong_type(v, name, "a non-negative integer");
    return v.get<uint64_t>();
  }

  // Shorthands for a named member of an object.
  int64_t i64(const json& obj, const std::string& parent, const char* key) const {
    return i64(field(obj, parent, key), join(parent, key));
  }
  int i32(const json& obj, const std::string& parent, const char* key) const {
    return i32(field(obj, parent, key), join(parent, key));
  }
  std::string string(const json& obj, const std::string& parent, const char* key) const {
    return string(field(obj, parent, key), join(parent, key));
  }
  const json& array(const json& obj, const std::string& parent, const char* key) const {
    return array(field(obj, parent, key), join(parent, key));
  }
  const json& object(const json& obj, const std::string& parent, const char* key) const {
    return object(field(obj, parent, key), join(parent, key));
  }

 private:
  [[noreturn]] void wrong_type(const json& v, const std::string& name, const char* expected) const {
    std::string shown = v.dump();
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    ST_BAD_INPUT(path_, ": ", name, " must be ", expected, ", got ", v.type_name(), " ", shown);
  }

  const std::string& path_;
};

// The model family: "arch" is absent from manifests written before the llama family, which are gpt2.
ModelArch parse_arch(const FieldReader& r, const json& j) {
  if (!j.contains("arch")) return ModelArch::kGpt2;
  const std::string a = r.string(j, "model", "arch");
  for (ModelArch arch : {ModelArch::kGpt2, ModelArch::kLlama})
    if (a == to_string(arch)) return arch;
  ST_BAD_INPUT(r.path(), ": model.arch is \"", a, "\", expected gpt2 or llama");
}

ModelConfig parse_model(const FieldReader& r, const json& j) {
  ModelConfig m;
  m.arch = parse_arch(r, j);
  m.n_layer = r.i32(j, "model", "n_layer");
  m.n_head = r.i32(j, "model", "n_head");
  m.n_embd = r.i32(j, "model", "n_embd");
  m.vocab_size = r.i32(j, "model", "vocab_size");
  m.seq_len = r.i32(j, "model", "seq_len");
  if (m.arch == ModelArch::kLlama) {
    m.n_kv_head = r.i32(j, "model", "n_kv_head");
    m.ffn_dim = r.i32(j, "model", "ffn_dim");
    m.rope_theta = static_cast<float>(r.number(r.field(j, "model", "rope_theta"), "model.rope_theta"));
    const std::string scaling = r.string(j, "model", "rope_scaling");
    if (scaling == to_string(RopeScaling::kLlama3)) {
      m.rope_scaling = RopeScaling::kLlama3;
    } else if (scaling != to_string(RopeScaling::kNone)) {
      ST_BAD_INPUT(r.path(), ": model.rope_scaling is \"", scaling, "\", expected none or llama3");
    }
    auto f32 = [&](const char* key) {
      return static_cast<float>(r.number(r.field(j, "model", key), join("model", key)));
    };
    m.rope_scaling_factor = f32("rope_scaling_factor");
    m.rope_scaling_low_freq_factor = f32("rope_scaling_low_freq_factor");
    m.rope_scaling_high_freq_factor = f32("rope_scaling_high_freq_factor");
    m.rope_scaling_original_max_position = r.i32(j, "model", "rope_scaling_original_max_position");
    m.rms_norm_eps = f32("rms_norm_eps");
    m.tie_embeddings = r.boolean(r.field(j, "model", "tie_embeddings"), "model.tie_embeddings");
    m.qkv_bias = r.boolean(r.field(j, "model", "qkv_bias"), "model.qkv_bias");
  }
  return m;
}

void parse_lora(const FieldReader& r, const json& j, Manifest* m) {
  LoraConfig& l = m->model.lora;
  l.rank = r.i64(j, "lora", "rank");
  l.alpha = static_cast<float>(r.number(r.field(j, "lora", "alpha"), "lora.alpha"));
  l.targets = r.string(j, "lora", "targets");
  l.rslora = r.boolean(r.field(j, "lora", "rslora"), "lora.rslora");
  const std::string dtype = r.string(j, "lora", "base_dtype");
  const std::optional<LoraBase> base_dtype = enum_from_name<LoraBase>(dtype);
  if (!base_dtype)
    ST_BAD_INPUT(r.path(), ": lora.base_dtype is \"", dtype, "\", expected one of: ", enum_name_list<LoraBase>());
  l.base_dtype = *base_dtype;
  const json& b = r.object(j, "lora", "base");
  m->base.init_from = r.string(b, "lora.base", "init_from");
  const json& files = r.array(b, "lora.base", "files");
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string fn = index("lora.base.files", i);
    r.object(files[i], fn);
    m->base.files.push_back(ManifestBaseFile{r.string(files[i], fn, "name"), r.string(files[i], fn, "sha256")});
  }
}

ManifestUnit parse_unit(const FieldReader& r, const json& j, const std::string& name) {
  ManifestUnit u;
  r.object(j, name);
  u.name = r.string(j, name, "name");
  u.numel = r.i64(j, name, "numel");
  const std::string tensors_name = join(name, "tensors");
  const json& tensors = r.array(j, name, "tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string tn = index(tensors_name, i);
    const json& tj = r.object(tensors[i], tn);
    ManifestTensor t;
    t.name = r.string(tj, tn, "name");
    const std::string shape_name = join(tn, "shape");
    const json& shape = r.array(tj, tn, "shape");
    for (size_t d = 0; d < shape.size(); ++d) t.shape.push_back(r.i64(shape[d], index(shape_name, d)));
    t.offset = r.i64(tj, tn, "offset");
    u.tensors.push_back(std::move(t));
  }
  return u;
}

ManifestFile parse_file(const FieldReader& r, const json& j, const std::string& name, const char* digest_key) {
  ManifestFile f;
  r.object(j, name);
  f.name = r.string(j, name, "name");
  f.rank = r.i32(j, name, "rank");
  f.bytes = r.i64(j, name, "bytes");
  f.digest = r.string(j, name, digest_key);
  const std::string spans_name = join(name, "spans");
  const json& spans = r.array(j, name, "spans");
  for (size_t i = 0; i < spans.size(); ++i) {
    const std::string sn = index(spans_name, i);
    const json& sj = r.object(spans[i], sn);
    f.spans.push_back(ShardSpan{r.i64(sj, sn, "offset"), r.i64(sj, sn, "count")});
  }
  return f;
}

bool is_lower_hex_sha256(const std::string& s) {
  return s.size() == 64 &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// The number of elements of a shape, or -1 if a dimension is negative or the product overflows.
int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return -1;
  }
  return n;
}

void require_at_least(const std::string& path, const std::string& name, int64_t value, int64_t min) {
  if (value < min) ST_BAD_INPUT(path, ": ", name, " is ", value, ", expected >= ", min);
}

// Each unit's [0, numel) must be covered by the files' spans exactly once.
void validate_coverage(const Manifest& m, const std::string& path) {
  struct Piece {
    ShardSpan span;
    size_t file;
  };
  for (size_t u = 0; u < m.units.size(); ++u) {
    const ManifestUnit& unit = m.units[u];
    const std::string unit_text = str_cat("unit ", unit.name, " (units[", u, "], numel ", unit.numel, ")");
    std::vector<Piece> pieces;
    for (size_t f = 0; f < m.files.size(); ++f) {
      const ShardSpan& s = m.files[f].spans[u];
      const std::string sn = str_cat("files[", f, "].spans[", u, "]");
      require_at_least(path, sn + ".offset", s.offset, 0);
      require_at_least(path, sn + ".count", s.count, 0);
      if (s.count > unit.numel || s.offset > unit.numel - s.count)
        ST_BAD_INPUT(path, ": ", sn, " = ", span_text(s), " runs past the end of ", unit_text);
      if (!s.empty()) pieces.push_back({s, f});
    }
    std::sort(pieces.begin(), pieces.end(),
              [](const Piece& a, const Piece& b) { return a.span.offset < b.span.offset; });
    int64_t covered = 0;  // [0, covered) is held by exactly one file so far
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      if (p.span.offset < covered)
        ST_BAD_INPUT(path, ": ", unit_text, ": files[", pieces[i - 1].file, "].spans[", u,
                     "] = ", span_text(pieces[i - 1].span), " and files[", p.file, "].spans[", u,
                     "] = ", span_text(p.span), " overlap");
      if (p.span.offset > covered)
        ST_BAD_INPUT(path, ": ", unit_text, ": elements ", span_text({covered, p.span.offset - covered}),
                     " are in no file's span");
      covered = p.span.end();
    }
    if (covered != unit.numel)
      ST_BAD_INPUT(path, ": ", unit_text, ": elements ", span_text({covered, unit.numel - covered}),
                   " are in no file's span");
  }
}

// node_local: a node of the writing run, and file indices of the manifest, ascending, each in one list at most.
void validate_node_local(const ManifestNodeLocal& n, int world_size, const std::string& path) {
  require_at_least(path, "node_local.nodes", n.nodes, 2);
  if (n.node < 0 || n.node >= n.nodes)
    ST_BAD_INPUT(path, ": node_local.node is ", n.node, ", expected in [0, node_local.nodes = ", n.nodes, ")");
  std::set<int> seen;
  for (const auto& [name, list] : {std::pair<const char*, const std::vector<int>*>{"primaries", &n.primaries},
                                   std::pair<const char*, const std::vector<int>*>{"replicas", &n.replicas}}) {
    for (size_t i = 0; i < list->size(); ++i) {
      const int f = (*list)[i];
      const std::string field = str_cat("node_local.", name, "[", i, "]");
      if (f < 0 || f >= world_size)
        ST_BAD_INPUT(path, ": ", field, " is ", f, ", expected a file index in [0, world_size = ", world_size, ")");
      if (i > 0 && f <= (*list)[i - 1]) ST_BAD_INPUT(path, ": ", field, " is ", f, ", expected ascending indices");
      if (!seen.insert(f).second) ST_BAD_INPUT(path, ": ", field, " is ", f, ", which node_local.primaries lists too");
    }
  }
}

}  // namespace

// Entries of one size, a multiple of the three operands a site has, at most train.fp8_amax_history's 1024 of them,
// each maximum finite and >= 0.
static void check_fp8_amax_history(const std::vector<std::vector<float>>& h, const std::string& path) {
  if (h.empty()) return;
  if (h.size() > 1024) ST_BAD_INPUT(path, ": fp8_amax_history holds ", h.size(), " entries, expected at most 1024");
  const size_t n = h.front().size();
  if (n == 0 || n % 3 != 0)
    ST_BAD_INPUT(path, ": fp8_amax_history.maxima_per_entry is ", n,
                 ", expected a positive multiple of 3 (x, W, dy a site)");
  for (size_t e = 0; e < h.size(); ++e) {
    if (h[e].size() != n)
      ST_BAD_INPUT(path, ": ", index("fp8_amax_history.entries", e), " holds ", h[e].size(), " maxima, expected ", n);
    for (size_t i = 0; i < n; ++i)
      if (!(std::isfinite(h[e][i]) && h[e][i] >= 0.0f && !std::signbit(h[e][i])))
        ST_BAD_INPUT(path, ": ", index(index("fp8_amax_history.entries", e), i), " is ", h[e][i],
                     ", expected a finite maximum >= 0");
  }
}

void validate_manifest(const Manifest& m, const std::string& path) {
  check_format_version(m.format_version, path);
  if (m.format_version == 1 && m.digest_piece_bytes != 0)
    ST_BAD_INPUT(path, ": digest_piece_bytes is ", m.digest_piece_bytes,
                 ", expected none in format version 1 (whole-file digests)");
  require_at_least(path, "step", m.step, 0);
  require_at_least(path, "world_size", m.world_size, 1);
  require_at_least(path, "model.n_layer", m.model.n_layer, 1);
  require_at_least(path, "model.n_head", m.model.n_head, 1);
  require_at_least(path, "model.n_embd", m.model.n_embd, 1);
  require_at_least(path, "model.vocab_size", m.model.vocab_size, 1);
  require_at_least(path, "model.seq_len", m.model.seq_len, 1);
  require_at_least(path, "optimizer_updates", m.optimizer_updates, 0);
  require_at_least(path, "lr_step", m.lr_step, 0);
  require_at_least(path, "data_cursor", m.data_cursor, 0);
  require_at_least(path, "global_batch", m.global_batch, 1);
  require_at_least(path, "skipped_steps", m.skipped_steps, 0);
  require_at_least(path, "train_windows", m.train_windows, 0);
  require_at_least(path, "loss_scale_good_steps", m.loss_scale_good_steps, 0);
  if (!std::isfinite(m.loss_scale) || m.loss_scale <= 0)
    ST_BAD_INPUT(path, ": loss_scale is ", m.loss_scale, ", expected a finite number > 0");
  if (m.rng_counters.size() != static_cast<size_t>(m.world_size))
    ST_BAD_INPUT(path, ": rng_counters has ", m.rng_counters.size(), " entries, expected world_size = ", m.world_size,
                 " (one per rank)");

  check_fp8_amax_history(m.fp8_amax_history, path);

  std::set<std::string> unit_names;
  for (size_t u = 0; u < m.units.size(); ++u) {
    const ManifestUnit& unit = m.units[u];
    const std::string un = index("units", u);
    // Unit names are HDF5 group names in the rank files.
    if (unit.name.empty() || unit.name.find('/') != std::string::npos)
      ST_BAD_INPUT(path, ": ", un, ".name is \"", unit.name, "\", expected a non-empty name without '/'");
    if (!unit_names.insert(unit.name).second)
      ST_BAD_INPUT(path, ": ", un, ".name \"", unit.name, "\" is used by an earlier unit too");
    require_at_least(path, un + ".numel", unit.numel, 0);
    int64_t next = 0;  // tensors tile the flat buffer in order
    for (size_t t = 0; t < unit.tensors.size(); ++t) {
      const ManifestTensor& tensor = unit.tensors[t];
      const std::string tn = str_cat(un, ".tensors[", t, "]");
      if (tensor.name.empty()) ST_BAD_INPUT(path, ": ", tn, ".name is empty");
      const int64_t n = shape_numel(tensor.shape);
      if (n < 0) ST_BAD_INPUT(path, ": ", tn, ".shape has a negative or too large dimension");
      if (tensor.offset != next)
        ST_BAD_INPUT(path, ": ", tn, ".offset is ", tensor.offset, ", expected ", next,
                     " (the end of the previous tensor)");
      if (__builtin_add_overflow(next, n, &next))
        ST_BAD_INPUT(path, ": ", tn, ".shape makes the unit larger than 2^63 elements");
    }
    if (next != unit.numel)
      ST_BAD_INPUT(path, ": ", un, ".numel is ", unit.numel, ", but its tensors hold ", next, " elements");
  }

  if (m.files.size() != static_cast<size_t>(m.world_size))
    ST_BAD_INPUT(path, ": files has ", m.files.size(), " entries, expected world_size = ", m.world_size,
                 " (one per rank)");
  if (m.format_version > 1 &&
      (m.digest_piece_bytes < kMinDigestPieceBytes || m.digest_piece_bytes > kMaxDigestPieceBytes))
    ST_BAD_INPUT(path, ": digest_piece_bytes is ", m.digest_piece_bytes, ", expected ", kMinDigestPieceBytes, " to ",
                 kMaxDigestPieceBytes);
  std::set<std::string> file_names;
  for (size_t f = 0; f < m.files.size(); ++f) {
    const ManifestFile& file = m.files[f];
    const std::string fn = index("files", f);
    // A plain name inside the step directory: never a path that could point elsewhere.
    if (file.name.empty() || file.name == "." || file.name == ".." || file.name.find('/') != std::string::npos)
      ST_BAD_INPUT(path, ": ", fn, ".name is \"", file.name, "\", expected a file name inside the step directory");
    if (!file_names.insert(file.name).second)
      ST_BAD_INPUT(path, ": ", fn, ".name \"", file.name, "\" is used by an earlier file too");
    if (file.rank != static_cast<int>(f)) ST_BAD_INPUT(path, ": ", fn, ".rank is ", file.rank, ", expected ", f);
    require_at_least(path, fn + ".bytes", file.bytes, 0);
    if (!is_lower_hex_sha256(file.digest))
      ST_BAD_INPUT(path, ": ", fn, ".", digest_field(m), " is \"", file.digest, "\", expected 64 lowercase hex digits");
    if (file.spans.size() != m.units.size())
      ST_BAD_INPUT(path, ": ", fn, ".spans has ", file.spans.size(), " entries, expected ", m.units.size(),
                   " (one per unit)");
  }
  validate_coverage(m, path);
  if (m.node_local) validate_node_local(*m.node_local, m.world_size, path);
  if (m.model.lora.enabled()) {
    require_at_least(path, "lora.rank", m.model.lora.rank, 1);
    if (!(m.model.lora.alpha > 0) || !std::isfinite(m.model.lora.alpha))
      ST_BAD_INPUT(path, ": lora.alpha is ", m.model.lora.alpha, ", expected a finite number > 0");
    for (size_t i = 0; i < m.base.files.size(); ++i)
      if (!is_lower_hex_sha256(m.base.files[i].sha256))
        ST_BAD_INPUT(path, ": lora.base.files[", i, "].sha256 is \"", m.base.files[i].sha256,
                     "\", expected 64 lowercase hex digits");
  } else if (!m.base.files.empty() || !m.base.init_from.empty()) {
    ST_BAD_INPUT(path, ": a LoRA base without lora.rank > 0");
  }
}

const char* digest_field(const Manifest& m) { return m.digest_piece_bytes > 0 ? "piece_sha256" : "sha256"; }

std::vector<int> files_held(const Manifest& m) {
  std::vector<int> held;
  if (!m.node_local) {
    for (int f = 0; f < m.world_size; ++f) held.push_back(f);
    return held;
  }
  held = m.node_local->primaries;
  held.insert(held.end(), m.node_local->replicas.begin(), m.node_local->replicas.end());
  std::sort(held.begin(), held.end());
  return held;
}

std::string manifest_to_json(const Manifest& m) {
  // JSON has no NaN or infinity: nlohmann would write null and the checkpoint could not be read back.
  ST_CHECK(std::isfinite(m.loss_scale), "loss_scale = ", m.loss_scale, " cannot be stored in JSON");
  ordered_json j;
  j["format_version"] = m.format_version;
  j["step"] = m.step;
  j["world_size"] = m.world_size;
  j["model"] = {{"arch", to_string(m.model.arch)}, {"n_layer", m.model.n_layer},       {"n_head", m.model.n_head},
                {"n_embd", m.model.n_embd},        {"vocab_size", m.model.vocab_size}, {"seq_len", m.model.seq_len}};
  if (m.model.is_llama()) {
    ordered_json& mj = j["model"];
    mj["n_kv_head"] = m.model.kv_heads();
    mj["ffn_dim"] = m.model.ffn_dim;
    mj["rope_theta"] = m.model.rope_theta;
    mj["rope_scaling"] = to_string(m.model.rope_scaling);
    mj["rope_scaling_factor"] = m.model.rope_scaling_factor;
    mj["rope_scaling_low_freq_factor"] = m.model.rope_scaling_low_freq_factor;
    mj["rope_scaling_high_freq_factor"] = m.model.rope_scaling_high_freq_factor;
    mj["rope_scaling_original_max_position"] = m.model.rope_scaling_original_max_position;
    mj["rms_norm_eps"] = m.model.rms_norm_eps;
    mj["tie_embeddings"] = m.model.tie_embeddings;
    mj["qkv_bias"] = m.model.qkv_bias;
  }
  if (m.model.lora.enabled()) {
    const LoraConfig& l = m.model.lora;
    ordered_json files = ordered_json::array();
    for (const ManifestBaseFile& f : m.base.files) files.push_back({{"name", f.name}, {"sha256", f.sha256}});
    j["lora"] = {{"rank", l.rank},
                 {"alpha", l.alpha},
                 {"targets", l.targets},
                 {"rslora", l.rslora},
                 {"base_dtype", to_string(l.base_dtype)},
                 {"base", {{"init_from", m.base.init_from}, {"files", std::move(files)}}}};
  }
  j["optimizer_updates"] = m.optimizer_updates;
  j["lr_step"] = m.lr_step;
  j["data_cursor"] = m.data_cursor;
  j["global_batch"] = m.global_batch;
  j["seed"] = m.seed;
  j["shuffle"] = m.shuffle;
  if (m.train_windows > 0) j["train_windows"] = m.train_windows;
  j["rng_counters"] = m.rng_counters;
  j["loss_scale"] = m.loss_scale;
  j["skipped_steps"] = m.skipped_steps;
  j["loss_scale_good_steps"] = m.loss_scale_good_steps;
  ordered_json files = ordered_json::array();
  for (const ManifestFile& f : m.files) {
    ordered_json spans = ordered_json::array();
    for (const ShardSpan& s : f.spans) spans.push_back({{"offset", s.offset}, {"count", s.count}});
    files.push_back({{"name", f.name},
                     {"rank", f.rank},
                     {"bytes", f.bytes},
                     {digest_field(m), f.digest},
                     {"spans", std::move(spans)}});
  }
  if (m.digest_piece_bytes > 0) j["digest_piece_bytes"] = m.digest_piece_bytes;
  j["files"] = std::move(files);
  ordered_json units = ordered_json::array();
  for (const ManifestUnit& u : m.units) {
    ordered_json tensors = ordered_json::array();
    for (const ManifestTensor& t : u.tensors)
      tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}});
    units.push_back({{"name", u.name}, {"numel", u.numel}, {"tensors", std::move(tensors)}});
  }
  j["units"] = std::move(units);
  if (m.node_local) {
    j["node_local"] = {{"node", m.node_local->node},
                       {"nodes", m.node_local->nodes},
                       {"primaries", m.node_local->primaries},
                       {"replicas", m.node_local->replicas}};
  }
  j["config_ini"] = m.config_ini;
  if (!m.gemm_algorithms.empty()) {
    j["gemm_algorithms"] = {{"device", m.gemm_algorithms.device},
                            {"library", m.gemm_algorithms.library},
                            {"plans", m.gemm_algorithms.plans}};
  }
  if (!m.fp8_amax_history.empty()) {  // the floats' bits: exact, whatever the JSON library prints
    ordered_json entries = ordered_json::array();
    for (const std::vector<float>& e : m.fp8_amax_history) {
      std::vector<uint32_t> bits(e.size());
      std::memcpy(bits.data(), e.data(), e.size() * sizeof(float));
      entries.push_back(bits);
    }
    j["fp8_amax_history"] = {{"maxima_per_entry", m.fp8_amax_history.front().size()}, {"entries", std::move(entries)}};
  }
  return j.dump(2) + "\n";
}

Manifest manifest_from_json(const std::string& text, const std::string& path) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    ST_BAD_INPUT(path, ": not valid JSON at byte ", e.byte, ": ", e.what());
  }
  const FieldReader r(path);
  r.object(j, "the top level");
  Manifest m;
  // The version comes first: a newer writer may have changed every other field.
  m.format_version = r.i32(j, "", "format_version");
  check_format_version(m.format_version, path);
  m.step = r.i64(j, "", "step");
  m.world_size = r.i32(j, "", "world_size");
  m.model = parse_model(r, r.object(j, "", "model"));
  // Added with LoRA; absent: full fine-tuning.
  if (j.contains("lora")) parse_lora(r, r.object(j, "", "lora"), &m);
  m.optimizer_updates = r.i64(j, "", "optimizer_updates");
  m.lr_step = r.i64(j, "", "lr_step");
  m.data_cursor = r.i64(j, "", "data_cursor");
  m.global_batch = r.i64(j, "", "global_batch");
  m.seed = r.u64(r.field(j, "", "seed"), "seed");
  m.shuffle = r.boolean(r.field(j, "", "shuffle"), "shuffle");
  // Optional: a manifest without it resumes with no check of the training data's size.
  if (j.contains("train_windows")) {
    m.train_windows = r.i64(j, "", "train_windows");
    require_at_least(path, "train_windows", m.train_windows, 1);
  }
  const json& counters = r.array(j, "", "rng_counters");
  for (size_t i = 0; i < counters.size(); ++i) m.rng_counters.push_back(r.u64(counters[i], index("rng_counters", i)));
  m.loss_scale = r.number(r.field(j, "", "loss_scale"), "loss_scale");
  m.skipped_steps = r.i64(j, "", "skipped_steps");
  // Added with fp16 training; manifests written before it have no such field and no scaling to resume.
  if (j.contains("loss_scale_good_steps")) m.loss_scale_good_steps = r.i64(j, "", "loss_scale_good_steps");
  // Version 1 hashes each whole file (validate_manifest checks the range).
  m.digest_piece_bytes = m.format_version == 1 ? 0 : r.i64(j, "", "digest_piece_bytes");
  const json& files = r.array(j, "", "files");
  for (size_t i = 0; i < files.size(); ++i)
    m.files.push_back(parse_file(r, files[i], index("files", i), digest_field(m)));
  const json& units = r.array(j, "", "units");
  for (size_t i = 0; i < units.size(); ++i) m.units.push_back(parse_unit(r, units[i], index("units", i)));
  m.config_ini = r.string(j, "", "config_ini");
  // Added with GEMM tuning; optional (the cpu backend records none).
  if (j.contains("gemm_algorithms")) {
    const json& g = r.object(j, "", "gemm_algorithms");
    m.gemm_algorithms.device = r.string(g, "gemm_algorithms", "device");
    m.gemm_algorithms.library = r.i64(g, "gemm_algorithms", "library");
    m.gemm_algorithms.plans = r.string(g, "gemm_algorithms", "plans");
  }
  // Written by train.fp8=delayed runs; optional.
  if (j.contains("fp8_amax_history")) {
    const json& h = r.object(j, "", "fp8_amax_history");
    const int64_t per_entry = r.i64(h, "fp8_amax_history", "maxima_per_entry");
    const json& entries = r.array(h, "fp8_amax_history", "entries");
    for (size_t e = 0; e < entries.size(); ++e) {
      const std::string en = index("fp8_amax_history.entries", e);
      const json& a = r.array(entries[e], en);
      if (static_cast<int64_t>(a.size()) != per_entry)
        ST_BAD_INPUT(path, ": ", en, " holds ", a.size(), " maxima, expected maxima_per_entry = ", per_entry);
      std::vector<float> maxima(a.size());
      for (size_t i = 0; i < a.size(); ++i) {
        const uint64_t bits = r.u64(a[i], index(en, i));
        if (bits > 0xffffffffu) ST_BAD_INPUT(path, ": ", index(en, i), " is ", bits, ", expected a float's 32 bits");
        const auto b32 = static_cast<uint32_t>(bits);
        std::memcpy(&maxima[i], &b32, sizeof(float));
      }
      m.fp8_amax_history.push_back(std::move(maxima));
    }
  }
  // Written by ckpt.replicas = 1 saves; optional.
  if (j.contains("node_local")) {
    const json& n = r.object(j, "", "node_local");
    ManifestNodeLocal nl;
    nl.node = r.i32(n, "node_local", "node");
    nl.nodes = r.i32(n, "node_local", "nodes");
    for (const auto& [key, list] : {std::pair<const char*, std::vector<int>*>{"primaries", &nl.primaries},
                                    std::pair<const char*, std::vector<int>*>{"replicas", &nl.replicas}}) {
      const json& a = r.array(n, "node_local", key);
      for (size_t i = 0; i < a.size(); ++i) list->push_back(r.i32(a[i], index(join("node_local", key), i)));
    }
    m.node_local = std::move(nl);
  }
  validate_manifest(m, path);
  return m;
}

void check_format_version(int64_t version, const std::string& path) {
  if (version < kOldestReadableFormatVersion || version > kCheckpointFormatVersion)
    ST_BAD_INPUT(path, ": unknown checkpoint format version ", version, " (this build reads versions ",
                 kOldestReadableFormatVersion, " to ", kCheckpointFormatVersion, ")");
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Manifest read_manifest(const std::string& path) { return manifest_from_json(read_file(path), path); }

void check_model_matches(const Manifest& m, const ModelConfig& model, const std::string& path) {
  if (m.model.arch != model.arch)
    ST_BAD_INPUT(path, ": the checkpoint holds a ", to_string(m.model.arch),
                 " model (model.arch=", to_string(m.model.arch),
                 "), the config asks for model.arch=", to_string(model.arch));
  std::string mismatches;
  auto compare = [&](const char* field, auto in_checkpoint, auto in_config) {
    if (in_checkpoint == in_config) return;
    if (!mismatches.empty()) mismatches += "; ";
    auto text = [](auto v) {
      if constexpr (std::is_same_v<decltype(v), bool>) {
        return std::string(v ? "true" : "false");
      } else if constexpr (std::is_floating_point_v<decltype(v)>) {
        std::ostringstream os;  // shortest text that round-trips a float is at most 9 significant digits
        os.imbue(std::locale::classic());
        os << std::setprecision(9) << v;
        return os.str();
      } else if constexpr (std::is_enum_v<decltype(v)>) {
        return std::string(to_string(v));
      } else {
        return std::to_string(v);
      }
    };
    mismatches += str_cat("model.", field, " is ", text(in_checkpoint), " in the checkpoint, ", text(in_config),
                          " in the config");
  };
  compare("n_layer", m.model.n_layer, model.n_layer);
  compare("n_head", m.model.n_head, model.n_head);
  compare("n_embd", m.model.n_embd, model.n_embd);
  compare("vocab_size", m.model.vocab_size, model.vocab_size);
  compare("seq_len", m.model.seq_len, model.seq_len);
  if (model.is_llama()) {
    compare("n_kv_head", m.model.kv_heads(), model.kv_heads());
    compare("ffn_dim", m.model.ffn_dim, model.ffn_dim);
    compare("rope_theta", m.model.rope_theta, model.rope_theta);
    compare("rope_scaling", m.model.rope_scaling, model.rope_scaling);
    if (model.rope_scaling == RopeScaling::kLlama3 && m.model.rope_scaling == RopeScaling::kLlama3) {
      compare("rope_scaling_factor", m.model.rope_scaling_factor, model.rope_scaling_factor);
      compare("rope_scaling_low_freq_factor", m.model.rope_scaling_low_freq_factor, model.rope_scaling_low_freq_factor);
      compare("rope_scaling_high_freq_factor", m.model.rope_scaling_high_freq_factor,
              model.rope_scaling_high_freq_factor);
      compare("rope_scaling_original_max_position", m.model.rope_scaling_original_max_position,
              model.rope_scaling_original_max_position);
    }
    compare("rms_norm_eps", m.model.rms_norm_eps, model.rms_norm_eps);
    compare("tie_embeddings", m.model.tie_embeddings, model.tie_embeddings);
    compare("qkv_bias", m.model.qkv_bias, model.qkv_bias);
  }
  // The adapters: their shapes and their scale (targets compare as written; both were validated by the same rule).
  const LoraConfig &a = m.model.lora, &b = model.lora;
  auto lora_field = [&](const char* field, const std::string& in_checkpoint, const std::string& in_config) {
    if (in_checkpoint == in_config) return;
    if (!mismatches.empty()) mismatches += "; ";
    mismatches += str_cat("lora.", field, " is ", in_checkpoint, " in the checkpoint, ", in_config, " in the config");
  };
  lora_field("rank", std::to_string(a.rank), std::to_string(b.rank));
  if (a.enabled() && b.enabled()) {
    auto text = [](float v) {
      std::ostringstream os;
      os.imbue(std::locale::classic());
      os << std::setprecision(9) << v;
      return os.str();
    };
    lora_field("alpha", text(a.alpha), text(b.alpha));
    lora_field("targets", a.targets, b.targets);
    lora_field("rslora", a.rslora ? "true" : "false", b.rslora ? "true" : "false");
    lora_field("base_dtype", to_string(a.base_dtype), to_string(b.base_dtype));
  }
  if (!mismatches.empty()) ST_BAD_INPUT(path, ": ", mismatches);
}

}  // namespace st
