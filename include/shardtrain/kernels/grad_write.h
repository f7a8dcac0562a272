// How a backward kernel writes an input gradient. The references accumulate (dinp += ...), so gradients of
// one tensor reached by two paths sum naturally. Where a buffer has a single producer per step, kOverwrite
// lets the caller skip zeroing it first: one pass over the buffer instead of a memset, a read and a write.
#pragma once

namespace st {

enum class GradWrite { kAccumulate, kOverwrite };

}  // namespace st
