#include "shardtrain/model/decoder_stage.h"

#include <algorithm>
#include <limits>

#include "shardtrain/core/error.h"
#include "shardtrain/core/format.h"
#include "shardtrain/model/units.h"

namespace st {
namespace {

// gpt2's head is always wte; llama's when tie_embeddings.
bool tied_head(const ModelConfig& model) { return !model.is_llama() || model.tie_embeddings; }

// The keys and values of one block for max_batch sequences of seq_len positions.
int64_t block_cache_elements(const ModelConfig& model, int max_batch) {
  return 2 * int64_t{max_batch} * model.seq_len * model.kv_heads() * model.head_dim();
}

}  // namespace

std::vector<bool> held_units(const ModelConfig& model, const DecoderStage& stage) {
  const int units = model.n_layer + 2;
  std::vector<bool> held(static_cast<size_t>(units), !stage.split());
  if (!stage.split()) return held;
  for (int u = std::max(stage.units.first, 0); u < std::min(stage.units.end, units); ++u)
    held[static_cast<size_t>(u)] = true;
  if (stage.last() && tied_head(model)) held[0] = true;
  return held;
}

LayerRange stage_layers(const ModelConfig& model, const DecoderStage& stage) {
  if (!stage.split()) return LayerRange{0, model.n_layer};
  // Unit u of a block is layer u - 1; the embedding (0) and the head (n_layer + 1) are none.
  return LayerRange{std::clamp(stage.units.first - 1, 0, model.n_layer),
                    std::clamp(stage.units.end - 1, 0, model.n_layer)};
}

int64_t stage_elements(const ModelConfig& model, int max_batch, const DecoderStage& stage) {
  const std::vector<bool> held = held_units(model, stage);
  int64_t n = int64_t{stage_layers(model, stage).count()} * block_cache_elements(model, max_batch);
  for (const UnitLayout& u : build_units(model))
    if (held[static_cast<size_t>(u.index)]) n += u.numel;
  return n;
}

std::vector<UnitRange> split_units(const ModelConfig& model, int max_batch, int stages) {
  const int L = model.n_layer;
  ST_CHECK(stages >= 1, "a layer split into ", stages, " stages");
  if (L < stages)
    ST_BAD_INPUT("a layer split over ", stages, " ranks needs a block for each, and this model has ", L,
                 " (model.n_layer ", L, "): run it on at most ", L, " rank(s), or without --split layers");
  // Stage s's elements: its blocks' weights and caches, plus the embedding on stage 0 and the head (with a tied
  // head's copy of the embedding) on the last. cost[s][j]: the least largest stage of stages 0 .. s - 1 covering
  // blocks 1 .. j; from[s][j]: where stage s - 1 starts (its first block is from + 1).
  const std::vector<UnitLayout> units = build_units(model);
  const int64_t embedding = units.front().numel;
  const int64_t head = units.back().numel + (tied_head(model) ? embedding : 0);
  std::vector<int64_t> prefix(static_cast<size_t>(L) + 1, 0);  // blocks 1 .. j
  for (int b = 1; b <= L; ++b)
    prefix[static_cast<size_t>(b)] = prefix[static_cast<size_t>(b) - 1] + units[static_cast<size_t>(b)].numel +
                                     block_cache_elements(model, max_batch);
  auto at = [](std::vector<std::vector<int64_t>>& m, int s, int j) -> int64_t& {
    return m[static_cast<size_t>(s)][static_cast<size_t>(j)];
  };
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> cost(static_cast<size_t>(stages) + 1, std::vector<int64_t>(L + 1, kNone));
  std::vector<std::vector<int64_t>> from(cost.size(), std::vector<int64_t>(L + 1, 0));
  for (int j = 1; j <= L; ++j) at(cost, 1, j) = embedding + prefix[static_cast<size_t>(j)] + (stages == 1 ? head : 0);
  for (int s = 2; s <= stages; ++s)
    for (int j = s; j <= L; ++j)
      for (int i = s - 1; i < j; ++i) {
        const int64_t mine = prefix[static_cast<size_t>(j)] - prefix[static_cast<size_t>(i)] + (s == stages ? head : 0);
        const int64_t worst = std::max(at(cost, s - 1, i), mine);
        if (worst < at(cost, s, j)) {
          at(cost, s, j) = worst;
          at(from, s, j) = i;
        }
      }
  // Back from the last stage: stage s - 1 runs blocks from[s][j] + 1 .. j, units the same numbers.
  std::vector<UnitRange> ranges(static_cast<size_t>(stages));
  int end = L;
  for (int s = stages; s >= 1; --s) {
    const int start = s == 1 ? 0 : static_cast<int>(at(from, s, end));
    ranges[static_cast<size_t>(s) - 1] = UnitRange{s == 1 ? 0 : start + 1, s == stages ? L + 2 : end + 1};
    end = start;
  }
  return ranges;
}

std::string describe_units(const ModelConfig& model, const UnitRange& range) {
  const std::vector<UnitLayout> units = build_units(model);
  const std::string& first = units.at(static_cast<size_t>(range.first)).name;
  return range.end - range.first > 1 ? first + " .. " + units.at(static_cast<size_t>(range.end) - 1).name : first;
}

std::string describe_split(const ModelConfig& model, const std::vector<UnitRange>& ranges) {
  std::string out;
  for (size_t s = 0; s < ranges.size(); ++s) {
    out += str_cat(s == 0 ? "" : "; ", "rank ", s, ": ", describe_units(model, ranges[s]));
    if (s + 1 == ranges.size() && ranges.size() > 1 && tied_head(model)) out += " (and embedding, the tied classifier)";
  }
  return out;
}

}  // namespace st
