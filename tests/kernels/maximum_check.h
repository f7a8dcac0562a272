// The optional `amax` output of the kernels that write a linear layer's input (rmsnorm_forward, swiglu_forward,
// rope_backward, ...): what it must hold, bit for bit, after a kernel wrote a tensor into a zeroed slot.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "shardtrain/kernels/fp8.h"

namespace st::testing {

// The tensorwise maximum fp8_maxima takes of `written` (the values as stored), as its bits. Finite values only:
// fp8_maxima refuses the others.
inline unsigned tensor_maximum(const std::vector<float>& written) {
  unsigned bits = 0;
  fp8_maxima(written.data(), 1, static_cast<int64_t>(written.size()), Fp8Scaling::kTensor, &bits, "written");
  return bits;
}

// The bits of a non-negative float, as a maximum holds them.
inline unsigned maximum_bits(float v) {
  unsigned bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

}  // namespace st::testing
