// The optional `amax` output of the kernels that write a linear layer's input (rmsnorm_forward, swiglu_forward,
// rope_backward, ...): what it must hold, bit for bit, after a kernel wrote a tensor into a zeroed slot.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
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

// A kernel that casts the tensor it computes as it computes it, with a maximum known ahead (swiglu_forward_fp8,
// rmsnorm_forward_fp8, ...), called as fused(q, q_t, inverse, own, f, amax): against casting `written` [rows, cols]
// (the tensor as the unfused kernel stores it) with each maximum of `given` (fp8_quantize_with_maxima; a zero maximum
// scales by 1, fp8_max's own scale), for both formats, its codes in both layouts, its inverse scale and the maximum
// it folds into a zeroed *own (written's own), bit for bit; and its transposed codes alone where q is null.
using FusedCast =
    std::function<void(uint8_t* q, uint8_t* q_t, float* inverse, unsigned* own, Fp8Format f, const unsigned* amax)>;

inline void expect_cast_ahead(const std::vector<float>& written, int64_t rows, int64_t cols,
                              const std::vector<float>& given, const FusedCast& fused) {
  const size_t n = written.size();
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2})
    for (float m : given) {
      SCOPED_TRACE(::testing::Message() << to_string(f) << " maximum " << m);
      const unsigned amax = maximum_bits(m), scaled_by = maximum_bits(m == 0.0f ? fp8_max(f) : m);
      std::vector<uint8_t> want(n), want_t(n), q(n, 0xab), q_t(n, 0xab), only(n, 0xab);
      float want_inv = 0, inv = 0;
      fp8_quantize_with_maxima(written.data(), rows, cols, f, Fp8Scaling::kTensor, false, Fp8Layout::kRowMajor,
                               &scaled_by, want.data(), &want_inv);
      fp8_quantize_with_maxima(written.data(), rows, cols, f, Fp8Scaling::kTensor, false, Fp8Layout::kTransposed,
                               &scaled_by, want_t.data(), &want_inv);
      unsigned own = 0;
      fused(q.data(), q_t.data(), &inv, &own, f, &amax);
      EXPECT_EQ(q, want);
      EXPECT_EQ(q_t, want_t);
      EXPECT_EQ(inv, want_inv);
      EXPECT_EQ(own, tensor_maximum(written));
      fused(nullptr, only.data(), &inv, nullptr, f, &amax);
      EXPECT_EQ(only, want_t);
    }
}

}  // namespace st::testing
