// The test-only fault seam: SHARDTRAIN_FAULT=POINT:RANK[@STEP] makes POINT fire on that rank (at that
// step only, if given). The points are listed with the variable in core/env.cc; each caller names its
// own point and passes its rank and step.
//
//   if (fault_injected("ckpt_enospc", rank, step)) ST_FAULT(...);
#pragma once

#include <cstdint>

namespace st {

// True when SHARDTRAIN_FAULT names `point`, `rank` and (if it has one) `step`. A malformed value is a
// kBadInput error naming the variable.
bool fault_injected(const char* point, int rank, int64_t step);

}  // namespace st
