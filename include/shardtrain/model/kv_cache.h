// The key/value cache of a CPU decoder (decoder.h): every position's keys and values, per layer, as the attention
// of later positions reads them (kernels/decode_attention.h). fp32, [layers, seq_len, NKV hs] for keys and the same
// for values: every layer's, or those of a stage of a layer split (decoder_stage.h), indexed by the model's layer
// numbers.
//
//   KvCache cache(cfg);
//   cache.append(layer, qkv, n, pos);    // the k and v parts of n fused qkv rows, at positions pos .. pos + n - 1
//   decode_attention(out, qkv, cfg.qkv_dim(), cache.keys(layer), cache.values(layer), n, pos, NH, NKV, hs);
#pragma once

#include <cstdint>
#include <vector>

#include "shardtrain/core/config.h"
#include "shardtrain/model/decoder_stage.h"

namespace st {

class KvCache {
 public:
  // Every layer's cache, or those of `layers` alone.
  explicit KvCache(const ModelConfig& cfg) : KvCache(cfg, LayerRange{0, cfg.n_layer}) {}
  KvCache(const ModelConfig& cfg, LayerRange layers);

  // Copies the key and value heads of n fused qkv rows [n, (NH + 2 NKV) hs] (attention.h's layout) into positions
  // pos .. pos + n - 1 of `layer` (one of its layers); pos + n <= seq_len.
  void append(int layer, const float* qkv, int64_t n, int64_t pos);
  const float* keys(int layer) const { return k_.data() + (layer - first_) * layer_elems_; }
  const float* values(int layer) const { return v_.data() + (layer - first_) * layer_elems_; }

 private:
  int first_;
  int64_t positions_, q_width_, kv_width_, qkv_width_, layer_elems_;
  std::vector<float> k_, v_;
};

}  // namespace st
