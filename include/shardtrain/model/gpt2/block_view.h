// Named pointers into a block unit's flat buffer (parameters or gradients, host or device, any element
// type), in the tensor order of units.h. Shared by the CPU model (gpt_model.cc) and the GPU model (cuda_gpt_model.cu).
//
//   const BlockView<const float> p(params, units[1 + layer]);   // p.qkvw points at attn.qkv.weight
#pragma once

#include "shardtrain/model/units.h"

namespace st {

template <typename P>
struct BlockView {
  P *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
  BlockView(P* base, const UnitLayout& u)
      : ln1w(base + u.tensors[0].offset),
        ln1b(base + u.tensors[1].offset),
        qkvw(base + u.tensors[2].offset),
        qkvb(base + u.tensors[3].offset),
        projw(base + u.tensors[4].offset),
        projb(base + u.tensors[5].offset),
        ln2w(base + u.tensors[6].offset),
        ln2b(base + u.tensors[7].offset),
        fcw(base + u.tensors[8].offset),
        fcb(base + u.tensors[9].offset),
        fcprojw(base + u.tensors[10].offset),
        fcprojb(base + u.tensors[11].offset) {}
};

}  // namespace st
