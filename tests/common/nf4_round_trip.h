// What a QLoRA unit's frozen segment holds (lora.base_dtype = nf4), worked out apart from the engine: the base
// model's weights at each frozen tensor's place, and in a block each matrix quantised whole to NF4 and dequantised
// (kernels/nf4.h). Header-only.
//
//   const std::vector<float> want = st::testing::nf4_round_trip(u, st::testing::frozen_segment(u, base[u.index]));
//   EXPECT_EQ(engine.sharded().gather_frozen(u.index), want);
#pragma once

#include <algorithm>
#include <vector>

#include "shardtrain/kernels/nf4.h"
#include "shardtrain/model/units.h"

namespace st::testing {

// A LoRA model's unit u's frozen segment (frozen_numel elements) from the base model's full buffer of that unit
// (base_model's unit list): each frozen tensor taken from where the base keeps it (its init_index).
inline std::vector<float> frozen_segment(const UnitLayout& u, const std::vector<float>& base_unit) {
  std::vector<float> out(static_cast<size_t>(u.frozen_numel));
  for (const TensorSpec& t : u.tensors)
    if (t.frozen) std::copy_n(base_unit.begin() + t.init_index, t.numel, out.begin() + (t.offset - u.numel));
  return out;
}

// The row counts of the Hugging Face linear layers a block matrix stacks: llama's attn.qkv (q: n_embd rows, then k
// and v, half the rest each) and mlp.gate_up (gate, up: half each); any other matrix, GPT-2's c_attn included, is one.
inline std::vector<int64_t> hf_layer_rows(const UnitLayout& u, const TensorSpec& t) {
  const bool llama = u.find("attn_norm.weight") != nullptr;
  const int64_t rows = t.shape[0], width = t.shape[1];
  if (llama && t.name == "attn.qkv.weight") return {width, (rows - width) / 2, (rows - width) / 2};
  if (llama && t.name == "mlp.gate_up.weight") return {rows / 2, rows / 2};
  return {rows};
}

// `segment`, unit u's frozen segment, as an NF4 base holds it: in a block each Hugging Face linear layer's weights
// quantised whole and dequantised, as bitsandbytes quantises each layer; the vectors, and every tensor of the
// embedding and head units, as given.
inline std::vector<float> nf4_round_trip(const UnitLayout& u, std::vector<float> segment) {
  if (u.kind != UnitKind::kBlock) return segment;
  for (const TensorSpec& t : u.tensors) {
    if (!t.frozen || t.shape.size() != 2) continue;
    float* x = segment.data() + (t.offset - u.numel);
    for (int64_t rows : hf_layer_rows(u, t)) {
      const int64_t n = rows * t.shape[1];
      nf4_dequantize(nf4_quantize(x, n, t.name).view(), x);
      x += n;
    }
  }
  return segment;
}

}  // namespace st::testing
