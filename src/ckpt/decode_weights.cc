#include "shardtrain/ckpt/decode_weights.h"

#include <cmath>
#include <filesystem>
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

// One process's full weights as host views: every unit whole (span [0, numel), frozen span [0, frozen_numel)), so
// that init_from_weights fills them as it fills one rank of one. Views need no pull or push: they are the weights.
class FullViews final : public HostViews {
 public:
  explicit FullViews(const ModelConfig& model) : units_(build_units(model)) {
    for (const UnitLayout& u : units_) {
      UnitShard sh;
      sh.span = ShardSpan{0, u.numel};
      sh.slot = u.numel;
      sh.param.assign(static_cast<size_t>(u.numel), kUnwritten);
      sh.frozen_span = ShardSpan{0, u.frozen_numel};
      sh.frozen_slot = u.frozen_numel;
      sh.frozen.assign(static_cast<size_t>(u.frozen_numel), kUnwritten);
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

// The elements of one segment of `u` that no load wrote, drawn from the seed as a model initialised from it holds
// them before a load overwrites the rest.
void draw_unwritten(const UnitLayout& u, const ModelConfig& model, uint64_t seed, Segment segment,
                    std::vector<float>* values) {
  const int64_t n = static_cast<int64_t>(values->size());
  for (int64_t i = 0; i < n;) {
    if (!std::isnan((*values)[static_cast<size_t>(i)])) {
      ++i;
      continue;
    }
    int64_t end = i + 1;
    while (end < n && std::isnan((*values)[static_cast<size_t>(end)])) ++end;
    init_unit_range(u, model, seed, i, end, values->data() + i, segment);
    i = end;
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

CheckpointWeights read_checkpoint_weights(const std::string& step_dir, const Config& cfg, LoraBaseCheck base_check) {
  const std::string manifest_path = (std::filesystem::path(step_dir) / "manifest.json").string();
  Manifest m = open_checkpoint(step_dir);
  check_model_matches(m, cfg.model, manifest_path);
  // The base first: a changed base file stops the read before any rank file is opened.
  if (m.model.lora.enabled() && base_check == LoraBaseCheck::kCheck)
    check_base_of_checkpoint(m, cfg.init.from, cfg.train.seed, manifest_path);

  // Every rank file there with its manifest size (a stat each), before the first is read.
  check_rank_file_sizes(step_dir, m);

  FullViews views(cfg.model);
  const std::vector<UnitLayout>& units = views.units();
  // The trainable tensors: each rank file's span of every unit, a file at a time. The spans cover every unit once
  // (read_manifest checked), so every element is written.
  for (int f = 0; f < m.world_size; ++f) {
    const ShardFileReader file = open_rank_file(step_dir, m, f, RankFileDigest::kSkip);
    for (const UnitLayout& u : units) {
      const ShardSpan& span = m.files[static_cast<size_t>(f)].spans[static_cast<size_t>(u.index)];
      file.read(u.name, ShardState::kParam, span, views.shard(u.index).param.data() + span.offset);
    }
  }
  // A LoRA checkpoint's frozen base, as a training engine reads it on load: init.from over the seed's draw.
  if (m.model.lora.enabled() && !cfg.init.from.empty()) init_from_weights(cfg.init.from, cfg.model, views);
  for (const UnitLayout& u : units) {
    std::vector<float>& frozen = views.shard(u.index).frozen;
    draw_unwritten(u, cfg.model, cfg.train.seed, Segment::kFrozen, &frozen);
    store_frozen(u, cfg, &frozen);
  }
  CheckpointWeights w;
  w.units = merge_lora(cfg.model, units, views.take_full());
  w.manifest = std::move(m);
  return w;
}

std::vector<std::vector<float>> read_init_from_weights(const Config& cfg) {
  if (cfg.init.from.empty()) ST_BAD_INPUT("init.from is empty: name a Hugging Face model directory or a GPT-2 file");
  if (cfg.model.lora.enabled())
    ST_BAD_INPUT("lora.rank = ", cfg.model.lora.rank, ": init.from ", cfg.init.from,
                 " holds a whole model, without adapters; decode adapters from the checkpoint that trained them "
                 "(leave lora.rank at 0 to decode init.from's model)");
  FullViews views(cfg.model);
  init_from_weights(cfg.init.from, cfg.model, views);
  for (const UnitLayout& u : views.units())
    draw_unwritten(u, cfg.model, cfg.train.seed, Segment::kTrainable, &views.shard(u.index).param);
  return views.take_full();
}

}  // namespace st
