// Named pointers into a llama block unit's flat buffer (parameters or gradients, host or device, any element type),
// found by the tensor names of units.h, so that tensors added to a block move none of them. qkvb is null without
// model.qkv_bias; a gradient view's pointer is null for a frozen tensor (LoRA's base).
//
//   const LlamaBlockView<const float> p(params, units[1 + layer]);   // p.qkvw points at attn.qkv.weight
#pragma once

#include "shardtrain/model/units.h"

namespace st {

template <typename P>
struct LlamaBlockView {
  P *attn_norm, *qkvw, *qkvb, *ow, *mlp_norm, *gate_up, *down;
  LlamaBlockView(P* base, const UnitLayout& u, ViewOf of = ViewOf::kParams)
      : attn_norm(tensor_in(base, u.tensor("attn_norm.weight"), of)),
        qkvw(tensor_in(base, u.tensor("attn.qkv.weight"), of)),
        qkvb(u.find("attn.qkv.bias") ? tensor_in(base, *u.find("attn.qkv.bias"), of) : nullptr),
        ow(tensor_in(base, u.tensor("attn.o.weight"), of)),
        mlp_norm(tensor_in(base, u.tensor("mlp_norm.weight"), of)),
        gate_up(tensor_in(base, u.tensor("mlp.gate_up.weight"), of)),
        down(tensor_in(base, u.tensor("mlp.down.weight"), of)) {}
};

}  // namespace st
