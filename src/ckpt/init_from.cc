#include "shardtrain/ckpt/init_from.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <regex>
#include <set>

#include "shardtrain/ckpt/gpt2_file.h"
#include "shardtrain/ckpt/h5.h"
#include "shardtrain/ckpt/hf_dir.h"
#include "shardtrain/ckpt/hf_export.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/ckpt/safetensors_reader.h"
#include "shardtrain/ckpt/tools.h"
#include "shardtrain/core/errno_text.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/excerpt.h"
#include "shardtrain/kernels/adamw_host.h"
#include "shardtrain/model/llama/llama_hf.h"

namespace st {
namespace {

constexpr const char* kEmbed = "model.embed_tokens.weight";
constexpr const char* kHead = "lm_head.weight";
constexpr size_t kUnusedShown = 5;  // an unused-tensor refusal names this many, then counts the rest

std::string shown(const std::string& path) { return excerpt(path, kExcerptPathChars); }

// init.from names something that is there: a missing path is called missing, before its suffix is judged.
void check_exists(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    ST_BAD_INPUT("init.from ", shown(path), ": ", errno_text_lower(err));
  }
}

// [r, c] of flat element `i` in a row-major tensor of `shape`.
std::string index_text(int64_t i, const std::vector<int64_t>& shape) {
  std::vector<int64_t> at(shape.size(), 0);
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] == 0) break;
    at[k] = i % shape[k];
    i /= shape[k];
  }
  return shape_text(at);
}

std::string float_text(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, 4);
  if (std::isnan(v)) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%08x", bits);
    return str_cat("nan (bits ", hex, ")");
  }
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", static_cast<double>(v));  // enough digits to tell any two floats apart
  return text;
}

// The first element of p[0, n) that is NaN or infinite, or -1.
int64_t first_non_finite(const float* p, int64_t n) {
  // Looked for on every core, by the exponent's bits (all ones: NaN or infinite), which vectorises; the first found
  // on one.
  uint32_t any = 0;
#pragma omp parallel for reduction(| : any) schedule(static) if (n >= (int64_t{1} << 16))
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, p + i, sizeof(bits));
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  if (any == 0) return -1;
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(p[i])) return i;
  return -1;
}

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

// The one unit whose host view is filled (HostViews::pull_unit): taking another puts this one back first, so a
// device backend holds one unit's view on the host at a time. Putting back uploads the view, unless a non-finite value
// was read into it (the load is refused then, and nothing non-finite reaches the device). A unit still in hand when
// an error unwinds is released without an upload.
class UnitInHand {
 public:
  explicit UnitInHand(HostViews& model) : model_(model) {}
  UnitInHand(const UnitInHand&) = delete;
  UnitInHand& operator=(const UnitInHand&) = delete;
  ~UnitInHand() {
    if (unit_ >= 0) model_.release_unit(unit_);
  }
  UnitShard& take(int unit) {
    if (unit != unit_) {
      put_back();
      model_.pull_unit(unit);
      unit_ = unit;
    }
    return model_.shard(unit);
  }
  void spoil() { spoiled_ = true; }  // a non-finite value went into the view in hand
  void put_back() {
    if (unit_ < 0) return;
    if (spoiled_)
      model_.release_unit(unit_);
    else
      model_.push_unit(unit_);
    unit_ = -1;
    spoiled_ = false;
  }

 private:
  HostViews& model_;
  int unit_ = -1;
  bool spoiled_ = false;
};

// A problem one rank found in the tensor data it read. Ranks read different parts (a llama directory: each its own
// spans), so every rank learns the first problem any rank found (lowest tensor, then element) and all refuse alike.
struct Finding {
  int64_t tensor = -1;  // the tensor's place in the load order; -1: none
  int64_t index = 0;    // the element, in the tensor as the file stores it
  uint32_t bits = 0;    // the value there, as fp32 bits
  uint32_t other = 0;   // the value it was compared with (a tied head's embedding element)
  int rank = 0;
  bool found() const { return tensor >= 0; }
  void note(int64_t t, int64_t i, uint32_t b, uint32_t o = 0) {
    if (!found() || t < tensor || (t == tensor && i < index)) *this = Finding{t, i, b, o, 0};
  }
};

// Collective over `comm`: the lowest finding of any rank. Every field is exact in a double (tensors and elements
// below 2^53, fp32 bits below 2^32), and each rank writes only its own slots of the sum.
Finding first_over_ranks(const Finding& mine, Communicator& comm) {
  constexpr int kFields = 5;
  std::vector<double> all(static_cast<size_t>(kFields * comm.world_size()), 0.0);
  if (mine.found()) {
    double* slot = all.data() + kFields * comm.rank();
    slot[0] = 1.0 + static_cast<double>(mine.tensor);
    slot[1] = static_cast<double>(mine.index);
    slot[2] = static_cast<double>(mine.bits);
    slot[3] = static_cast<double>(mine.other);
    slot[4] = 1.0;
  }
  comm.all_reduce(all.data(), static_cast<int64_t>(all.size()));
  Finding first;
  for (int r = 0; r < comm.world_size(); ++r) {
    const double* slot = all.data() + kFields * r;
    if (slot[4] == 0.0) continue;
    const int64_t t = static_cast<int64_t>(slot[0]) - 1, i = static_cast<int64_t>(slot[1]);
    if (!first.found() || t < first.tensor || (t == first.tensor && i < first.index))
      first = Finding{t, i, static_cast<uint32_t>(slot[2]), static_cast<uint32_t>(slot[3]), r};
  }
  return first;
}

[[noreturn]] void refuse_non_finite(const std::string& path, const std::string& tensor, const std::string& file,
                                    const std::vector<int64_t>& shape, const Finding& f, int world) {
  ST_BAD_INPUT("init.from ", shown(path), ": tensor ", tensor, " in ", shown(file),
               " holds a non-finite value: element ", f.index, " (index ", index_text(f.index, shape), ") is ",
               float_text(f.bits), world > 1 ? str_cat(" (found by rank ", f.rank, ")") : std::string(),
               "; weights with NaN or inf give a non-finite loss at every step, so they are refused before step 1");
}

[[noreturn]] void refuse_head_copy(const std::string& path, const std::string& embed, const std::string& file,
                                   const std::vector<int64_t>& shape, const Finding& f, const std::string& why_tied) {
  ST_BAD_INPUT("init.from ", shown(path), ": tensor ", kHead, " in ", shown(file), " differs from ", embed,
               " at element ", f.index, " (index ", index_text(f.index, shape), "): ", float_text(f.bits), " against ",
               float_text(f.other), "; ", why_tied,
               ", so the file may hold lm_head.weight only as an exact copy of the embedding (a different head would "
               "be dropped)");
}

// The tensors left unused (sorted), refused naming the first few and the count; `where` gives a tensor's file for
// the message, `n_layer_source` where the model's layer count comes from.
[[noreturn]] void refuse_unused(const std::string& path, const std::vector<std::string>& unused, const ModelConfig& cfg,
                                const std::function<std::string(const std::string&)>& where,
                                const std::string& n_layer_source) {
  std::string names;
  for (size_t i = 0; i < unused.size() && i < kUnusedShown; ++i)
    names += (i ? ", " : "") + excerpt(unused[i]) + " (" + shown(where(unused[i])) + ")";
  if (unused.size() > kUnusedShown) names += str_cat(" and ", unused.size() - kUnusedShown, " more");
  // Layers past the model's: the usual cause is a layer count that disagrees with the file.
  static const std::regex layer_re(R"((?:^|\.)(?:layers|h)\.([0-9]{1,9})\.)");
  int64_t top = -1;
  for (const std::string& name : unused) {
    std::smatch m;
    if (std::regex_search(name, m, layer_re)) top = std::max<int64_t>(top, std::stoll(m[1].str()));
  }
  const std::string layers = top >= cfg.n_layer
                                 ? str_cat(". The file(s) hold layers up to ", top, " (", top + 1,
                                           " layers), the model has ", cfg.n_layer, " (", n_layer_source, ")")
                                 : std::string();
  ST_BAD_INPUT("init.from ", shown(path), ": ", unused.size(), " tensor(s) would be left unused (this model is ",
               to_string(cfg.arch), " with ", cfg.n_layer, " layers): ", names, layers,
               ". Only rotary caches (*.rotary_emb.inv_freq), GPT-2's attention masks (h.N.attn.bias, "
               "h.N.attn.masked_bias) of the model's layers and a tied head's copy of the embedding (lm_head.weight) "
               "may go unused (docs/checkpoints.md)");
}

bool is_allowed_buffer(const std::string& name, const ModelConfig& cfg) {
  static const std::regex rotary_re(R"(model\.(?:layers\.([0-9]{1,9})\.self_attn\.)?rotary_emb\.inv_freq)");
  static const std::regex mask_re(R"((?:transformer\.)?h\.([0-9]{1,9})\.attn\.(?:bias|masked_bias))");
  std::smatch m;
  if (cfg.is_llama() && std::regex_match(name, m, rotary_re))
    return !m[1].matched || std::stoll(m[1].str()) < cfg.n_layer;
  if (!cfg.is_llama() && std::regex_match(name, m, mask_re)) return std::stoll(m[1].str()) < cfg.n_layer;
  return false;
}

// ---- llama-family directories ----

// What the headers of a Hugging Face directory must show before a byte of tensor data is read: config.json's
// vocabulary and width in the embedding's shape, every tensor of the model with its shape and a readable dtype,
// nothing else but the allowed extras. Returns whether lm_head.weight is there as a tied head's copy.
bool check_llama_dir(const std::string& dir, const HfDirWeights& w, const ModelConfig& cfg,
                     const std::vector<HfRange>& map) {
  const std::string config_json = (std::filesystem::path(dir) / "config.json").string();
  const std::vector<int64_t> embed_shape{cfg.vocab_size, cfg.n_embd};
  if (w.has(kEmbed) && w.shape(kEmbed) != embed_shape)
    ST_BAD_INPUT("init.from ", shown(dir), ": ", shown(config_json), " has vocab_size ", cfg.vocab_size,
                 " and hidden_size ", cfg.n_embd, ", but tensor ", kEmbed, " in ", shown(w.path_of(kEmbed)),
                 " has shape ", shape_text(w.shape(kEmbed)), " (expected ", shape_text(embed_shape),
                 "): config.json does not describe these weights");
  std::set<std::string> used;
  for (const HfRange& r : map) {
    w.check(r.hf_name, r.hf_shape);
    used.insert(r.hf_name);
  }
  bool head_copy = false;
  std::vector<std::string> unused;
  for (const std::string& name : w.names()) {
    if (used.count(name) != 0 || is_allowed_buffer(name, cfg)) continue;
    if (name == kHead && cfg.tie_embeddings) {
      if (w.shape(kHead) != embed_shape)
        ST_BAD_INPUT("init.from ", shown(dir), ": tensor ", kHead, " in ", shown(w.path_of(kHead)), " has shape ",
                     shape_text(w.shape(kHead)), ", expected ", shape_text(embed_shape), " (", config_json,
                     " has tie_word_embeddings true: the head is the embedding, and lm_head.weight may only be its "
                     "copy)");
      w.check(kHead, embed_shape);  // a dtype it can be read in, to be compared
      head_copy = true;
      continue;
    }
    unused.push_back(name);
  }
  if (!unused.empty())
    refuse_unused(
        dir, unused, cfg, [&](const std::string& n) { return w.path_of(n); }, "num_hidden_layers in " + config_json);
  return head_copy;
}

// A tied head's copy against the embedding: the share [rank, rank + 1) of `world` of their elements, compared bit
// for bit; the first that differs, as a finding past the map's tensors (none: nothing found).
Finding check_head_copy(const HfDirWeights& weights, const ModelConfig& cfg, const std::vector<HfRange>& map, int rank,
                        int world) {
  Finding mine;
  const int64_t n = int64_t{cfg.vocab_size} * cfg.n_embd;
  const int64_t begin = n * rank / world, end = n * (rank + 1) / world;
  constexpr int64_t kChunk = int64_t{1} << 20;
  std::vector<float> a(static_cast<size_t>(std::min(kChunk, std::max<int64_t>(end - begin, 1)))), b(a.size());
  for (int64_t at = begin; at < end && !mine.found(); at += kChunk) {
    const int64_t count = std::min(kChunk, end - at);
    weights.read_range(kHead, at, count, a.data());
    weights.read_range(kEmbed, at, count, b.data());
    for (int64_t i = 0; i < count; ++i)
      if (bits_of(a[static_cast<size_t>(i)]) != bits_of(b[static_cast<size_t>(i)])) {
        mine.note(static_cast<int64_t>(map.size()), at + i, bits_of(a[static_cast<size_t>(i)]),
                  bits_of(b[static_cast<size_t>(i)]));
        break;
      }
  }
  return mine;
}

// Refuses what a llama directory's read found: a tied head that is not the embedding's copy, or a non-finite value.
[[noreturn]] void refuse_llama_finding(const std::string& dir, const HfDirWeights& weights, const ModelConfig& cfg,
                                       const std::vector<HfRange>& map, const Finding& first, int world) {
  const std::vector<int64_t> embed_shape{cfg.vocab_size, cfg.n_embd};
  if (first.tensor == static_cast<int64_t>(map.size()))
    refuse_head_copy(dir, kEmbed, weights.path_of(kHead), embed_shape, first,
                     "config.json has tie_word_embeddings true");
  const HfRange& r = map[static_cast<size_t>(first.tensor)];
  refuse_non_finite(dir, r.hf_name, weights.path_of(r.hf_name), r.hf_shape, first, world);
}

// Every rank checks every tensor's presence, shape and dtype (from the headers), so a bad directory fails on all ranks
// alike; then it reads only the elements inside its own spans, and the ranks agree on what the data held.
void init_from_hf_dir(const std::string& dir, const ModelConfig& cfg, HostViews& model) {
  if (!cfg.is_llama())
    ST_BAD_INPUT("init.from ", shown(dir), " is a directory (a Hugging Face llama or qwen2 model); this model is ",
                 "model.arch=", to_string(cfg.arch), ": a GPT-2 model starts from a .safetensors or .h5 file");
  const HfDirWeights weights(dir);
  const std::vector<HfRange> map = llama_hf_tensor_map(cfg, model.units());
  const bool head_copy = check_llama_dir(dir, weights, cfg, map);
  Communicator& comm = model.comm();
  // Unit by unit in the map's order: only the ranges read below change; the padding rows keep their zero init.
  Finding mine;
  UnitInHand hand(model);
  for (size_t k = 0; k < map.size(); ++k) {
    const HfRange& r = map[k];
    const UnitLayout& unit = model.units()[static_cast<size_t>(r.unit)];
    const ShardSpan part = owned_range(model.shard(r.unit), unit, r.offset, r.numel).part;
    if (part.count == 0) continue;
    float* out = owned_range(hand.take(r.unit), unit, r.offset, r.numel).data;
    weights.read_range(r.hf_name, part.offset - r.offset, part.count, out);
    // On the host, before the unit is pushed: the same check for every backend.
    const int64_t bad = first_non_finite(out, part.count);
    if (bad >= 0) {
      mine.note(static_cast<int64_t>(k), part.offset - r.offset + bad, bits_of(out[bad]));
      hand.spoil();
    }
  }
  hand.put_back();
  const Finding first = first_over_ranks(
      head_copy && !mine.found() ? check_head_copy(weights, cfg, map, comm.rank(), comm.world_size()) : mine, comm);
  if (first.found()) refuse_llama_finding(dir, weights, cfg, map, first, comm.world_size());
}

// ---- GPT-2 files ----

void init_from_gpt2_file(const std::string& path, const ModelConfig& cfg, HostViews& model) {
  const Gpt2File file(path);
  const std::vector<HfTensorMap> map = hf_gpt2_tensor_map(cfg, model.units());
  // Names first, from the header alone: missing and unused tensors are refused before any data is read.
  std::vector<std::string> in_file;
  std::set<std::string> used;
  for (const HfTensorMap& m : map) {
    in_file.push_back(file.resolve(m.hf_name));
    used.insert(in_file.back());
  }
  const auto wte_at =
      std::find_if(map.begin(), map.end(), [](const HfTensorMap& m) { return m.hf_name == "transformer.wte.weight"; });
  ST_CHECK(wte_at != map.end(), "the GPT-2 map has no transformer.wte.weight");
  const size_t wte_k = static_cast<size_t>(wte_at - map.begin());
  const std::vector<int64_t> wte_shape = wte_at->hf_shape;  // [vocab_size, C]
  bool head_copy = false;
  std::vector<std::string> unused;
  for (const std::string& name : file.names()) {
    if (used.count(name) != 0 || is_allowed_buffer(name, cfg)) continue;
    if (name == kHead) {  // GPT-2 always ties the head to wte
      if (file.shape(name) != wte_shape)
        ST_BAD_INPUT("init.from ", shown(path), ": tensor ", kHead, " has shape ", shape_text(file.shape(name)),
                     ", expected ", shape_text(wte_shape),
                     " (GPT-2's head is tied to wte: lm_head.weight may only be its copy)");
      head_copy = true;
      continue;
    }
    unused.push_back(name);
  }
  if (!unused.empty())
    refuse_unused(
        path, unused, cfg, [&](const std::string&) { return path; }, "model.n_layer");

  // Unit by unit in the map's order: only the tensors read below change; the rest (wte padding rows) keeps its init.
  Finding mine;
  UnitInHand hand(model);
  std::vector<float> hf, ours, wte;
  for (size_t k = 0; k < map.size() && !mine.found(); ++k) {
    const HfTensorMap& m = map[k];
    const TensorSpec& t = *m.tensor;
    int64_t hf_numel = 1;
    for (int64_t d : m.hf_shape) hf_numel *= d;
    // The HF tensor covers [t.offset, t.offset + hf_numel) of the unit (wte: the real vocabulary rows, which come
    // first; the padding rows after them keep their zero init). A rank that owns none of it (a layer split's other
    // stages' units) does not read it.
    const UnitLayout& unit = model.units()[static_cast<size_t>(m.unit)];
    const ShardSpan part = owned_range(model.shard(m.unit), unit, t.offset, hf_numel).part;
    if (part.count == 0) continue;
    hf.resize(static_cast<size_t>(hf_numel));
    file.read(in_file[k], m.hf_shape, hf.data());
    // Every rank that owns a part reads the whole tensor; checked on the host, before any push.
    const int64_t bad = first_non_finite(hf.data(), hf_numel);
    if (bad >= 0) {
      mine.note(static_cast<int64_t>(k), bad, bits_of(hf[static_cast<size_t>(bad)]));
      break;
    }
    if (k == wte_k && head_copy) wte = hf;
    const float* src = hf.data();
    if (m.transpose) {  // Conv1D [in, out] -> ours [out, in]
      ours.resize(static_cast<size_t>(hf_numel));
      transpose_2d(hf.data(), ours.data(), m.hf_shape[0], m.hf_shape[1]);
      src = ours.data();
    }
    // Keep what this rank owns.
    std::copy(src + (part.offset - t.offset), src + (part.offset - t.offset) + part.count,
              owned_range(hand.take(m.unit), unit, t.offset, hf_numel).data);
  }
  hand.put_back();
  if (head_copy && !mine.found() && !wte.empty()) {  // by the ranks that read wte
    hf.resize(wte.size());
    file.read(kHead, wte_shape, hf.data());
    for (size_t i = 0; i < wte.size(); ++i)
      if (bits_of(hf[i]) != bits_of(wte[i])) {
        mine.note(static_cast<int64_t>(map.size()), static_cast<int64_t>(i), bits_of(hf[i]), bits_of(wte[i]));
        break;
      }
  }
  const Finding first = first_over_ranks(mine, model.comm());
  if (first.found()) {
    if (first.tensor == static_cast<int64_t>(map.size()))
      refuse_head_copy(path, in_file[wte_k], path, wte_shape, first, "GPT-2 ties its head to wte");
    const HfTensorMap& m = map[static_cast<size_t>(first.tensor)];
    refuse_non_finite(path, in_file[static_cast<size_t>(first.tensor)], path, m.hf_shape, first,
                      model.comm().world_size());
  }
}

}  // namespace

void check_init_from(const std::string& path, const ModelConfig& cfg) {
  // A file, a missing path or a directory for a GPT-2 model: init_from_weights says what is wrong, when it is used.
  if (!std::filesystem::is_directory(path) || !cfg.is_llama()) return;
  const HfDirWeights weights(path);
  check_llama_dir(path, weights, cfg, llama_hf_tensor_map(cfg, build_units(cfg)));
}

void init_from_hf_dir_half(const std::string& dir, const ModelConfig& cfg, uint64_t seed, HalfKind kind,
                           const std::vector<bool>& held, const HalfUnitSink& sink) {
  ST_CHECK(cfg.is_llama() && !cfg.lora.enabled(), "init_from_hf_dir_half reads a llama model without adapters");
  check_exists(dir);
  const HfDirWeights weights(dir);
  const std::vector<UnitLayout> units = build_units(cfg);
  const std::vector<HfRange> map = llama_hf_tensor_map(cfg, units);
  const bool head_copy = check_llama_dir(dir, weights, cfg, map);
  std::vector<uint16_t> values;
  std::vector<float> drawn;
  for (const UnitLayout& u : units) {
    if (!held.empty() && !held[static_cast<size_t>(u.index)]) continue;
    values.resize(static_cast<size_t>(u.numel));
    // The directory's ranges of the unit, then what they leave out (the vocabulary's padding rows) as the seed draws
    // it (init_unit_range: each element a function of its index alone), rounded as the ranges are.
    std::vector<std::pair<int64_t, int64_t>> covered;
    for (size_t k = 0; k < map.size(); ++k) {
      const HfRange& r = map[k];
      if (r.unit != u.index) continue;
      const int64_t bad = weights.read_range_half(r.hf_name, 0, r.numel, kind, values.data() + r.offset);
      if (bad >= 0) {
        float value;
        weights.read_range(r.hf_name, bad, 1, &value);
        Finding f;
        f.note(static_cast<int64_t>(k), bad, bits_of(value));
        refuse_llama_finding(dir, weights, cfg, map, f, 1);
      }
      covered.emplace_back(r.offset, r.offset + r.numel);
    }
    std::sort(covered.begin(), covered.end());
    int64_t at = 0;
    covered.emplace_back(u.numel, u.numel);
    for (const auto& [begin, end] : covered) {
      if (begin > at) {
        drawn.resize(static_cast<size_t>(begin - at));
        init_unit_range(u, cfg, seed, at, begin, drawn.data(), Segment::kTrainable);
        round_to_half(drawn.data(), begin - at, kind, values.data() + at);
      }
      at = std::max(at, end);
    }
    sink(u.index, values);
  }
  // After the values, as init_from_weights checks it: a non-finite value is named first.
  if (head_copy) {
    const Finding differs = check_head_copy(weights, cfg, map, 0, 1);
    if (differs.found()) refuse_llama_finding(dir, weights, cfg, map, differs, 1);
  }
}

void init_from_weights(const std::string& path, const ModelConfig& cfg, HostViews& model) {
  check_exists(path);
  if (std::filesystem::is_directory(path)) return init_from_hf_dir(path, cfg, model);
  init_from_gpt2_file(path, cfg, model);
}

}  // namespace st
