// Named pointers into a llama block unit's flat buffer (parameters or gradients, host or device, any element type),
// found by the tensor names of units.h, so that tensors added to a block move none of them. qkvb is null without
// model.qkv_bias.
//
//   const LlamaBlockView<const float> p(params, units[1 + layer]);   // p.qkvw points at attn.qkv.weight
#pragma once

#include "shardtrain/model/units.h"

namespace st {

template <typename P>
struct LlamaBlockView {
  P *attn_norm, *qkvw, *qkvb, *ow, *mlp_norm, *gate_up, *down;
  LlamaBlockView(P* base, const UnitLayout& u)
      : attn_norm(base + u.tensor("attn_norm.weight").offset),
        qkvw(base + u.tensor("attn.qkv.weight").offset),
        qkvb(u.find("attn.qkv.bias") ? base + u.find("attn.qkv.bias")->offset : nullptr),
        ow(base + u.tensor("attn.o.weight").offset),
        mlp_norm(base + u.tensor("mlp_norm.weight").offset),
        gate_up(base + u.tensor("mlp.gate_up.weight").offset),
        down(base + u.tensor("mlp.down.weight").offset) {}
};

}  // namespace st
