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
