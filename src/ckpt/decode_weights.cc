#include "shardtrain/ckpt/decode_weights.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "shardtrain/ckpt/checkpoint_check.h"
#include "shardtrain/ckpt/init_from.h"
#include "shardtrain/ckpt/lora_base.h"
#include "shardtrain/ckpt/manifest.h"
#include "shardtrain/ckpt/shard_file.h"
#include "shardtrain/core/error.h"
#include "shardtrain/kernels/adamw_host.h"
#include "shardtrain/model/lora.h"
#include "shardtrain/model/nf4_base.h"
#include "shardtrain/shard/host_views.h"

namespace st {
namespace {

// What no loader writes: init.from refuses every non-finite value before it writes a unit, so an element that still
// holds this after a load is one the source does not have.
constexpr float kUnwritten = std::numeric_limits<float>::quiet_NaN();

// Whether unit u is one of `held` (empty: every unit is).
bool wanted(const std::vector<bool>& held, int u) { return held.empty() || held[static_cast<size_t>(u)]; }

// One process's full weights as host views: every unit it holds whole (span [0, numel), frozen span [0,
// frozen_numel)), so that init_from_weights fills them as it fills one rank of one; the others empty (spans of none,
// which the loaders skip). Views need no pull or push: they are the weights.
class FullViews final : public HostViews {
 public:
  FullViews(const ModelConfig& model, const std::vector<bool>& held) : units_(build_units(model)) {
    for (const UnitLayout& u : units_) {
      const bool mine = wanted(held, u.index);
      UnitShard sh;
      sh.span = ShardSpan{0, mine ? u.numel : 0};
      sh.slot = sh.span.count;
      sh.param.assign(static_cast<size_t>(sh.slot), kUnwritten);
      sh.frozen_span = ShardSpan{0, mine ? u.frozen_numel : 0};
      sh.frozen_slot = sh.frozen_span.count;
      sh.frozen.assign(static_cast<size_t>(sh.frozen_slot), kUnwritten);
      shards_.push_back(std::move(sh));
    }
  }
  const std::vector<UnitLayout>& units() const override { return units_; }
  Communicator& comm() override { return solo_; }
  UnitShard& shard(int unit) override { return shards_[static_cast<size_t>(unit)]; }

  // Each unit's trainable tensors, then its frozen ones: the layout merge_lora reads.
  std::vector<std::vector<float>> take_full() {
    std::vector<std::vector<float>> out;
    for (UnitShard& sh : shards_) {
      out.push_back(std::move(sh.param));
      out.back().insert(out.back().end(), sh.frozen.begin(), sh.frozen.end());
      std::vector<float>().swap(sh.frozen);
    }
    return out;
  }

 private:
  std::vector<UnitLayout> units_;
  SoloCommunicator solo_;
  std::vector<UnitShard> shards_;
};

// One process's full weights as host views that hold one unit at a time: pull_unit fills the unit's view with
// kUnwritten, push_unit hands it to `done` (which may take the vector's contents) and frees it, so that a loader going
// through the units in order (init_from_weights does) never holds more than one unit's fp32 buffer. A unit pulled
// again after its push is a loader out of order (an internal error); finish() pushes every unit held that the loader
// never pulled, all unwritten. The units not held have spans of none: the loaders skip them, and `done` never sees
// them. Not for LoRA models (their frozen views stay empty).
class StreamViews final : public HostViews {
 public:
  using Done = std::function<void(const UnitLayout& u, std::vector<float>& values)>;
  StreamViews(const ModelConfig& model, const std::vector<bool>& held, Done done)
      : units_(build_units(model)), held_(held), done_(std::move(done)) {
    for (const UnitLayout& u : units_) {
      UnitShard sh;
      sh.span = ShardSpan{0, wanted(held_, u.index) ? u.numel : 0};
      sh.slot = sh.span.count;
      shards_.push_back(std::move(sh));
    }
    pushed_.assign(units_.size(), false);
  }
  const std::vector<UnitLayout>& units() const override { return units_; }
  Communicator& comm() override { return solo_; }
  UnitShard& shard(int unit) override { return shards_[static_cast<size_t>(unit)]; }
  void pull_unit(int unit) override {
    ST_CHECK(!pushed_[static_cast<size_t>(unit)], "unit ", units_[static_cast<size_t>(unit)].name,
             " pulled again after its push: a streamed load goes through the units in order");
    std::vector<float>& param = shards_[static_cast<size_t>(unit)].param;
    param.swap(spare_);  // the last unit's buffer, when the done callback left it
    const int64_t n = units_[static_cast<size_t>(unit)].numel;
    param.resize(static_cast<size_t>(n));
    float* p = param.data();
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 16))
    for (int64_t i = 0; i < n; ++i) p[i] = kUnwritten;
  }
  void push_unit(int unit) override {
    std::vector<float>& param = shards_[static_cast<size_t>(unit)].param;
    done_(units_[static_cast<size_t>(unit)], param);
    pushed_[static_cast<size_t>(unit)] = true;
    param.swap(spare_);
    std::vector<float>().swap(param);
  }
  void release_unit(int unit) override { std::vector<float>().swap(shards_[static_cast<size_t>(unit)].param); }
  void finish() {
    for (const UnitLayout& u : units_)
      if (wanted(held_, u.index) && !pushed_[static_cast<size_t>(u.index)]) {
        pull_unit(u.index);
        push_unit(u.index);
      }
  }

 private:
  std::vector<UnitLayout> units_;
  std::vector<bool> held_;
  Done done_;
  SoloCommunicator solo_;
  std::vector<UnitShard> shards_;
  std::vector<bool> pushed_;
  std::vector<float> spare_;
};

// The elements of one segment of `u` that no load wrote, drawn from the seed as a model initialised from it holds
// them before a load overwrites the rest.
void draw_unwritten(const UnitLayout& u, const ModelConfig& model, uint64_t seed, Segment segment,
                    std::vector<float>* values) {
  // Each element's draw depends on its index alone (init_unit_range), so chunks scan and draw on their own.
  constexpr int64_t kChunk = int64_t{1} << 20;
  const int64_t n = static_cast<int64_t>(values->size());
  float* v = values->data();
#pragma omp parallel for schedule(dynamic, 1) if (n > kChunk)
  for (int64_t chunk = 0; chunk < n; chunk += kChunk) {
    const int64_t stop = std::min(n, chunk + kChunk);
    // Most chunks hold no NaN: a vectorised look first (x != x only for NaN).
    bool unwritten = false;
    for (int64_t i = chunk; i < stop; ++i) unwritten |= v[i] != v[i];
    if (!unwritten) continue;
    for (int64_t i = chunk; i < stop;) {
      if (!std::isnan(v[i])) {
        ++i;
        continue;
      }
      int64_t end = i + 1;
      while (end < stop && std::isnan(v[end])) ++end;
      init_unit_range(u, model, seed, i, end, v + i, segment);
      i = end;
    }
  }
}

// The frozen segment as the backend of `cfg` stores it and gives it back (ModelBackend::gather_frozen): an NF4
// block's quantised and dequantised; any other rounded to the compute dtype on a GPU, whose frozen shards hold it.
void store_frozen(const UnitLayout& u, const Config& cfg, std::vector<float>* frozen) {
  if (frozen->empty()) return;
  if (u.nf4_base) {
    const Nf4UnitStorage s = nf4_unit_storage(u);
    std::vector<float> words(static_cast<size_t>(s.words));
    nf4_quantize_unit(u, s, frozen->data(), storage_bytes(words));
    nf4_dequantize_unit(u, s, storage_bytes(words), frozen->data());
    return;
  }
  if (cfg.train.device != Device::kCuda) return;
  const DType t = cfg.compute_dtype();
  for (float& x : *frozen) {
    if (t == DType::kBF16) x = bf16_to_float(round_to_bf16(x));
    if (t == DType::kF16) x = f16_to_float(round_to_f16(x));
  }
}

}  // namespace

Manifest read_checkpoint_weights(const std::string& step_dir, const Config& cfg, LoraBaseCheck base_check,
                                 const UnitSink& sink, const std::vector<bool>& held) {
  const std::string manifest_path = (std::filesystem::path(step_dir) / "manifest.json").string();
  Manifest m = open_checkpoint(step_dir);
  check_model_matches(m, cfg.model, manifest_path);
  // The base first: a changed base file stops the read before any rank file is opened.
  if (m.model.lora.enabled() && base_check == LoraBaseCheck::kCheck)
    check_base_of_checkpoint(m, cfg.init.from, cfg.train.seed, manifest_path);

  // Every rank file there with its manifest size (a stat each), before the first is read.
  check_rank_file_sizes(step_dir, m);
  std::vector<ShardFileReader> files;
  for (int f = 0; f < m.world_size; ++f) files.push_back(open_rank_file(step_dir, m, f, RankFileDigest::kSkip));
  // Each rank file's span of a unit's trainable tensors. The spans cover every unit once (read_manifest checked), so
  // every element is written.
  const std::vector<UnitLayout> units = build_units(cfg.model);
  auto read_params = [&](const UnitLayout& u, float* out) {
    for (int f = 0; f < m.world_size; ++f) {
      const ShardSpan& span = m.files[static_cast<size_t>(f)].spans[static_cast<size_t>(u.index)];
      files[static_cast<size_t>(f)].read(u.name, ShardState::kParam, span, out + span.offset);
    }
  };
  if (!m.model.lora.enabled()) {
    // A unit at a time, straight to the sink: one unit's fp32 buffer on the host at once.
    std::vector<float> values;
    for (const UnitLayout& u : units) {
      if (!wanted(held, u.index)) continue;
      values.resize(static_cast<size_t>(u.numel));
      read_params(u, values.data());
      sink(u.index, values);
    }
    return m;
  }
  FullViews views(cfg.model, held);
  for (const UnitLayout& u : units)
    if (wanted(held, u.index)) read_params(u, views.shard(u.index).param.data());
  // A LoRA checkpoint's frozen base, as a training engine reads it on load: init.from over the seed's draw.
  if (!cfg.init.from.empty()) init_from_weights(cfg.init.from, cfg.model, views);
  for (const UnitLayout& u : units) {
    std::vector<float>& frozen = views.shard(u.index).frozen;
    draw_unwritten(u, cfg.model, cfg.train.seed, Segment::kFrozen, &frozen);
    store_frozen(u, cfg, &frozen);
  }
  // Each unit merged as it goes to the sink, its full buffer freed then: the whole model once, and one merged unit.
  std::vector<std::vector<float>> full = views.take_full();
  const std::vector<UnitLayout> base_units = build_units(base_model(cfg.model));
  for (size_t u = 0; u < full.size(); ++u) {
    if (!wanted(held, static_cast<int>(u))) continue;
    std::vector<float> merged = merge_lora_unit(cfg.model, units[u], base_units[u], full[u]);
    std::vector<float>().swap(full[u]);
    sink(static_cast<int>(u), merged);
  }
  return m;
}

CheckpointWeights read_checkpoint_weights(const std::string& step_dir, const Config& cfg, LoraBaseCheck base_check) {
  CheckpointWeights w;
  w.manifest = read_checkpoint_weights(step_dir, cfg, base_check, [&](int u, std::vector<float>& values) {
    if (static_cast<size_t>(u) >= w.units.size()) w.units.resize(static_cast<size_t>(u) + 1);
    w.units[static_cast<size_t>(u)] = std::move(values);
  });
  return w;
}

void read_init_from_weights(const Config& cfg, const UnitSink& sink, const std::vector<bool>& held) {
  if (cfg.init.from.empty()) ST_BAD_INPUT("init.from is empty: name a Hugging Face model directory or a GPT-2 file");
  if (cfg.model.lora.enabled())
    ST_BAD_INPUT("lora.rank = ", cfg.model.lora.rank, ": init.from ", cfg.init.from,
                 " holds a whole model, without adapters; decode adapters from the checkpoint that trained them "
                 "(leave lora.rank at 0 to decode init.from's model)");
  StreamViews views(cfg.model, held, [&](const UnitLayout& u, std::vector<float>& values) {
    draw_unwritten(u, cfg.model, cfg.train.seed, Segment::kTrainable, &values);
    sink(u.index, values);
  });
  init_from_weights(cfg.init.from, cfg.model, views);
  views.finish();
}

std::vector<std::vector<float>> read_init_from_weights(const Config& cfg) {
  std::vector<std::vector<float>> units;
  read_init_from_weights(cfg, [&](int u, std::vector<float>& values) {
    if (static_cast<size_t>(u) >= units.size()) units.resize(static_cast<size_t>(u) + 1);
    units[static_cast<size_t>(u)] = std::move(values);
  });
  return units;
}

}  // namespace st
