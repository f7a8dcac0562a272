// Named pointers into a block unit's flat buffer (parameters or gradients, host or device, any element
// type), found by the tensor names of units.h, so that tensors added to a block move none of them. A gradient view's
// pointer is null for a frozen tensor (LoRA's base). Shared by the CPU
// model (gpt_model.cc) and the GPU model (cuda_gpt_model.cu).
//
//   const BlockView<const float> p(params, units[1 + layer]);   // p.qkvw points at attn.qkv.weight
#pragma once

#include "shardtrain/model/units.h"

namespace st {

template <typename P>
struct BlockView {
  P *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
  BlockView(P* base, const UnitLayout& u, ViewOf of = ViewOf::kParams)
      : ln1w(tensor_in(base, u.tensor("ln1.weight"), of)),
        ln1b(tensor_in(base, u.tensor("ln1.bias"), of)),
        qkvw(tensor_in(base, u.tensor("attn.qkv.weight"), of)),
        qkvb(tensor_in(base, u.tensor("attn.qkv.bias"), of)),
        projw(tensor_in(base, u.tensor("attn.proj.weight"), of)),
        projb(tensor_in(base, u.tensor("attn.proj.bias"), of)),
        ln2w(tensor_in(base, u.tensor("ln2.weight"), of)),
        ln2b(tensor_in(base, u.tensor("ln2.bias"), of)),
        fcw(tensor_in(base, u.tensor("mlp.fc.weight"), of)),
        fcb(tensor_in(base, u.tensor("mlp.fc.bias"), of)),
        fcprojw(tensor_in(base, u.tensor("mlp.proj.weight"), of)),
        fcprojb(tensor_in(base, u.tensor("mlp.proj.bias"), of)) {}
};

}  // namespace st
