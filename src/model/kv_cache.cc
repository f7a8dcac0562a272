#include "shardtrain/model/kv_cache.h"

#include <algorithm>

#include "shardtrain/core/error.h"

namespace st {

KvCache::KvCache(const ModelConfig& cfg, LayerRange layers)
    : first_(layers.first),
      positions_(cfg.seq_len),
      q_width_(int64_t{cfg.n_head} * cfg.head_dim()),
      kv_width_(int64_t{cfg.kv_heads()} * cfg.head_dim()),
      qkv_width_(cfg.qkv_dim()),
      layer_elems_(positions_ * kv_width_),
      k_(static_cast<size_t>(layers.count() * layer_elems_)),
      v_(k_.size()) {}

void KvCache::append(int layer, const float* qkv, int64_t n, int64_t pos) {
  ST_CHECK(pos >= 0 && n >= 1 && pos + n <= positions_, "positions ", pos, " .. ", pos + n - 1, " outside the cache's ",
           positions_);
  float* k = k_.data() + (layer - first_) * layer_elems_ + pos * kv_width_;
  float* v = v_.data() + (layer - first_) * layer_elems_ + pos * kv_width_;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = qkv + i * qkv_width_ + q_width_;
    std::copy(row, row + kv_width_, k + i * kv_width_);
    std::copy(row + kv_width_, row + 2 * kv_width_, v + i * kv_width_);
  }
}

}  // namespace st
