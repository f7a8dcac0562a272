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

// `segment`, unit u's frozen segment, as an NF4 base holds it: in a block each matrix (two dimensions) quantised
// whole and dequantised; the vectors, and every tensor of the embedding and head units, as given.
inline std::vector<float> nf4_round_trip(const UnitLayout& u, std::vector<float> segment) {
  if (u.kind != UnitKind::kBlock) return segment;
  for (const TensorSpec& t : u.tensors) {
    if (!t.frozen || t.shape.size() != 2) continue;
    float* x = segment.data() + (t.offset - u.numel);
    nf4_dequantize(nf4_quantize(x, t.numel, t.name).view(), x);
  }
  return segment;
}

}  // namespace st::testing
