#include "shardtrain/model/fp8_history.h"

#include <algorithm>
#include <cstring>

#include "shardtrain/core/error.h"
#include "shardtrain/kernels/fp8_history.h"

namespace st {

Fp8AmaxHistory::Fp8AmaxHistory(int64_t sites, int length)
    : sites_(sites),
      length_(length),
      ring_(static_cast<size_t>(sites * kFp8Operands * length), 0),
      step_(static_cast<size_t>(sites * kFp8Operands), 0),
      history_max_(step_.size(), 0) {
  ST_CHECK(sites >= 0 && length >= 1 && length <= 1024, "Fp8AmaxHistory: ", sites, " sites, length ", length,
           " (expected sites >= 0 and length in [1, 1024])");
}

unsigned Fp8AmaxHistory::pick(int64_t index, unsigned own, bool record) {
  ST_CHECK(index >= 0 && index < entry_size(), "Fp8AmaxHistory: operand ", index, " outside ", entry_size());
  const auto i = static_cast<size_t>(index);
  unsigned applied = 0;
  fp8_delayed_maxima(&own, &step_[i], &history_max_[i], &applied, 1, record);
  return applied;
}

float Fp8AmaxHistory::scale_max(int64_t index) const {
  float m = 0.0f;
  std::memcpy(&m, &history_max_.at(static_cast<size_t>(index)), sizeof(m));
  return m;
}

void Fp8AmaxHistory::push(const std::vector<unsigned>& entry) {
  ST_CHECK(static_cast<int64_t>(entry.size()) == entry_size(), "Fp8AmaxHistory: an entry of ", entry.size(),
           " maxima, expected ", entry_size());
  newest_ = (newest_ + 1) % length_;
  filled_ = std::min(filled_ + 1, length_);
  fp8_history_push(entry.data(), entry_size(), ring_.data(), length_, newest_, filled_, history_max_.data(),
                   step_.data());
}

void Fp8AmaxHistory::drop() { std::fill(step_.begin(), step_.end(), 0u); }

std::vector<std::vector<float>> Fp8AmaxHistory::entries() const {
  std::vector<std::vector<float>> out;
  const auto n = static_cast<size_t>(entry_size());
  for (int i = 0; i < filled_; ++i) {
    out.emplace_back(n);
    std::memcpy(out.back().data(), ring_.data() + static_cast<size_t>((newest_ - i + length_) % length_) * n,
                n * sizeof(float));
  }
  return out;
}

void Fp8AmaxHistory::load(const std::vector<std::vector<float>>& entries) {
  for (size_t i = 0; i < entries.size(); ++i)
    ST_CHECK(static_cast<int64_t>(entries[i].size()) == entry_size(), "Fp8AmaxHistory: entry ", i, " holds ",
             entries[i].size(), " maxima, expected ", entry_size(), " (", sites_, " sites x ", kFp8Operands, ")");
  *this = Fp8AmaxHistory(sites_, length_);
  // Oldest kept first, so that the newest lands last.
  const int keep = static_cast<int>(std::min<size_t>(entries.size(), static_cast<size_t>(length_)));
  std::vector<unsigned> bits(static_cast<size_t>(entry_size()));
  for (int i = keep - 1; i >= 0; --i) {
    std::memcpy(bits.data(), entries[static_cast<size_t>(i)].data(), bits.size() * sizeof(float));
    push(bits);
  }
}

}  // namespace st
