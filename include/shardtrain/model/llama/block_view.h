// Named pointers into a llama block unit's flat buffer (parameters or gradients, host or device, any element type),
// in the tensor order of units.h. qkvb is null without model.qkv_bias.
//
//   const LlamaBlockView<const float> p(params, units[1 + layer]);   // p.qkvw points at attn.qkv.weight
#pragma once

#include "shardtrain/model/units.h"

namespace st {

template <typename P>
struct LlamaBlockView {
  P *attn_norm, *qkvw, *qkvb, *ow, *mlp_norm, *gate_up, *down;
  LlamaBlockView(P* base, const UnitLayout& u) {
    const bool bias = u.tensors.size() > 2 && u.tensors[2].name == "attn.qkv.bias";
    size_t i = 0;
    attn_norm = base + u.tensors[i++].offset;
    qkvw = base + u.tensors[i++].offset;
    qkvb = bias ? base + u.tensors[i++].offset : nullptr;
    ow = base + u.tensors[i++].offset;
    mlp_norm = base + u.tensors[i++].offset;
    gate_up = base + u.tensors[i++].offset;
    down = base + u.tensors[i++].offset;
  }
};

}  // namespace st
