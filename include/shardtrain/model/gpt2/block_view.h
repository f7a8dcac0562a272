// Named pointers into a block unit's flat buffer (parameters or gradients, host or device, any element
// type), found by the tensor names of units.h, so that tensors added to a block move none of them. Shared by the CPU
// model (gpt_model.cc) and the GPU model (cuda_gpt_model.cu).
//
//   const BlockView<const float> p(params, units[1 + layer]);   // p.qkvw points at attn.qkv.weight
#pragma once

#include "shardtrain/model/units.h"

namespace st {

template <typename P>
struct BlockView {
  P *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
  BlockView(P* base, const UnitLayout& u)
      : ln1w(base + u.tensor("ln1.weight").offset),
        ln1b(base + u.tensor("ln1.bias").offset),
        qkvw(base + u.tensor("attn.qkv.weight").offset),
        qkvb(base + u.tensor("attn.qkv.bias").offset),
        projw(base + u.tensor("attn.proj.weight").offset),
        projb(base + u.tensor("attn.proj.bias").offset),
        ln2w(base + u.tensor("ln2.weight").offset),
        ln2b(base + u.tensor("ln2.bias").offset),
        fcw(base + u.tensor("mlp.fc.weight").offset),
        fcb(base + u.tensor("mlp.fc.bias").offset),
        fcprojw(base + u.tensor("mlp.proj.weight").offset),
        fcprojb(base + u.tensor("mlp.proj.bias").offset) {}
};

}  // namespace st
