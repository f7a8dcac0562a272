#include "shardtrain/model/units.h"

#include <cmath>

#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"

namespace st {
namespace {

// Appends a tensor at the end of the unit's flat buffer.
void add(UnitLayout& u, std::string name, std::vector<int64_t> shape, InitKind init, bool decay) {
  TensorSpec t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.numel = 1;
  for (int64_t d : t.shape) t.numel *= d;
  t.offset = u.numel;
  t.init = init;
  t.weight_decay = decay;
  u.numel += t.numel;
  u.tensors.push_back(std::move(t));
}

// Which initialisation stream a unit draws from: its index, offset so that it never collides with
// streams that other parts of the program derive from the same seed.
constexpr uint64_t kInitStreamBase = 0x1000;

}  // namespace

const TensorSpec& UnitLayout::tensor(const std::string& tensor_name) const {
  for (const TensorSpec& t : tensors)
    if (t.name == tensor_name) return t;
  ST_CHECK(false, "unit ", name, " has no tensor ", tensor_name);
}

std::vector<UnitLayout> build_units(const ModelConfig& cfg) {
  const int64_t C = cfg.n_embd, Vp = cfg.padded_vocab(), T = cfg.seq_len;
  std::vector<UnitLayout> units;

  UnitLayout emb;
  emb.kind = UnitKind::kEmbedding;
  emb.name = "embedding";
  add(emb, "wte", {Vp, C}, InitKind::kEmbeddingPadded, false);
  add(emb, "wpe", {T, C}, InitKind::kNormal, false);
  units.push_back(std::move(emb));

  for (int l = 0; l < cfg.n_layer; ++l) {
    UnitLayout b;
    b.kind = UnitKind::kBlock;
    b.layer = l;
    b.name = "block." + std::to_string(l);
    add(b, "ln1.weight", {C}, InitKind::kOnes, false);
    add(b, "ln1.bias", {C}, InitKind::kZeros, false);
    add(b, "attn.qkv.weight", {3 * C, C}, InitKind::kNormal, true);
    add(b, "attn.qkv.bias", {3 * C}, InitKind::kZeros, false);
    add(b, "attn.proj.weight", {C, C}, InitKind::kResidualProj, true);
    add(b, "attn.proj.bias", {C}, InitKind::kZeros, false);
    add(b, "ln2.weight", {C}, InitKind::kOnes, false);
    add(b, "ln2.bias", {C}, InitKind::kZeros, false);
    add(b, "mlp.fc.weight", {4 * C, C}, InitKind::kNormal, true);
    add(b, "mlp.fc.bias", {4 * C}, InitKind::kZeros, false);
    add(b, "mlp.proj.weight", {C, 4 * C}, InitKind::kResidualProj, true);
    add(b, "mlp.proj.bias", {C}, InitKind::kZeros, false);
    units.push_back(std::move(b));
  }

  UnitLayout head;
  head.kind = UnitKind::kHead;
  head.name = "head";
  add(head, "lnf.weight", {C}, InitKind::kOnes, false);
  add(head, "lnf.bias", {C}, InitKind::kZeros, false);
  units.push_back(std::move(head));

  for (size_t i = 0; i < units.size(); ++i) units[i].index = static_cast<int>(i);
  return units;
}

int64_t count_params(const std::vector<UnitLayout>& units) {
  int64_t n = 0;
  for (const UnitLayout& u : units) n += u.numel;
  return n;
}

void init_unit_range(const UnitLayout& unit, const ModelConfig& cfg, uint64_t seed, int64_t begin, int64_t end,
                     float* out) {
  ST_CHECK(0 <= begin && begin <= end && end <= unit.numel, "range [", begin, ", ", end, ") outside unit ",
           unit.name, " of ", unit.numel);
  const double std_normal = 0.02;
  const double std_resid = 0.02 / std::sqrt(2.0 * cfg.n_layer);
  const uint64_t stream = kInitStreamBase + static_cast<uint64_t>(unit.index);
  for (const TensorSpec& t : unit.tensors) {
    const int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel);
    const int64_t row_len = t.shape.back();
#pragma omp parallel for schedule(static)
    for (int64_t i = lo; i < hi; ++i) {
      float value = 0.0f;
      switch (t.init) {
        case InitKind::kNormal:
          value = static_cast<float>(std_normal * normal_at(seed, stream, static_cast<uint64_t>(i)));
          break;
        case InitKind::kResidualProj:
          value = static_cast<float>(std_resid * normal_at(seed, stream, static_cast<uint64_t>(i)));
          break;
        case InitKind::kZeros:
          value = 0.0f;
          break;
        case InitKind::kOnes:
          value = 1.0f;
          break;
        case InitKind::kEmbeddingPadded: {
          const int64_t row = (i - t.offset) / row_len;
          value = row < cfg.vocab_size ? static_cast<float>(std_normal * normal_at(seed, stream, static_cast<uint64_t>(i)))
                                       : 0.0f;
          break;
        }
      }
      out[i - begin] = value;
    }
  }
}

}  // namespace st
