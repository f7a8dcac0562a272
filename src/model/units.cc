#include "shardtrain/model/units.h"

#include <cmath>

#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"
#include "shardtrain/model/family.h"

namespace st {
void add_tensor(UnitLayout& u, std::string name, std::vector<int64_t> shape, InitKind init, bool decay) {
  TensorSpec t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.numel = 1;
  for (int64_t d : t.shape) t.numel *= d;
  t.offset = u.numel;
  t.init_index = t.offset;
  t.init = init;
  t.weight_decay = decay;
  u.numel += t.numel;
  u.tensors.push_back(std::move(t));
}

namespace {

// Which initialisation stream a unit draws from: its index, offset so that it never collides with
// streams that other parts of the program derive from the same seed.
constexpr uint64_t kInitStreamBase = 0x1000;

}  // namespace

const TensorSpec* UnitLayout::find(const std::string& tensor_name) const {
  for (const TensorSpec& t : tensors)
    if (t.name == tensor_name) return &t;
  return nullptr;
}

const TensorSpec& UnitLayout::tensor(const std::string& tensor_name) const {
  const TensorSpec* t = find(tensor_name);
  ST_CHECK(t != nullptr, "unit ", name, " has no tensor ", tensor_name);
  return *t;
}

std::vector<UnitLayout> build_units(const ModelConfig& cfg) {
  std::vector<UnitLayout> units = model_family(cfg.arch).build_units(cfg);
  add_lora(units, cfg);
  for (size_t i = 0; i < units.size(); ++i) units[i].index = static_cast<int>(i);
  return units;
}

int64_t count_params(const std::vector<UnitLayout>& units) {
  int64_t n = 0;
  for (const UnitLayout& u : units) n += u.numel + u.frozen_numel;
  return n;
}

int64_t count_trainable_params(const std::vector<UnitLayout>& units) {
  int64_t n = 0;
  for (const UnitLayout& u : units) n += u.numel;
  return n;
}

void init_unit_range(const UnitLayout& unit, const ModelConfig& cfg, uint64_t seed, int64_t begin, int64_t end,
                     float* out, Segment segment) {
  const bool frozen = segment == Segment::kFrozen;
  const int64_t size = frozen ? unit.frozen_numel : unit.numel;
  ST_CHECK(0 <= begin && begin <= end && end <= size, "range [", begin, ", ", end, ") outside unit ", unit.name,
           frozen ? "'s frozen tensors" : "", " of ", size);
  const int64_t base = frozen ? unit.numel : 0;  // the segment's start in the unit's flat buffer
  const double std_normal = 0.02;
  const double std_resid = 0.02 / std::sqrt(2.0 * cfg.n_layer);
  const uint64_t stream = kInitStreamBase + static_cast<uint64_t>(unit.index);
  for (const TensorSpec& t : unit.tensors) {
    if (t.frozen != frozen) continue;
    const int64_t first = t.offset - base;  // the tensor's first element in the segment
    const int64_t lo = std::max(begin, first), hi = std::min(end, first + t.numel);
    const int64_t row_len = t.shape.back();
    const double bound = 1.0 / std::sqrt(static_cast<double>(row_len));
#pragma omp parallel for schedule(static)
    for (int64_t i = lo; i < hi; ++i) {
      const uint64_t draw = static_cast<uint64_t>(t.init_index + (i - first));
      float value = 0.0f;
      switch (t.init) {
        case InitKind::kNormal:
          value = static_cast<float>(std_normal * normal_at(seed, stream, draw));
          break;
        case InitKind::kResidualProj:
          value = static_cast<float>(std_resid * normal_at(seed, stream, draw));
          break;
        case InitKind::kZeros:
          value = 0.0f;
          break;
        case InitKind::kOnes:
          value = 1.0f;
          break;
        case InitKind::kEmbeddingPadded: {
          const int64_t row = (i - first) / row_len;
          value = row < cfg.vocab_size ? static_cast<float>(std_normal * normal_at(seed, stream, draw)) : 0.0f;
          break;
        }
        case InitKind::kKaimingUniform:
          value = static_cast<float>(bound * (2.0 * uniform_at(seed, stream, draw) - 1.0));
          break;
      }
      out[i - begin] = value;
    }
  }
}

}  // namespace st
