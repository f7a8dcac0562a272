// The host AdamW kernels (AVX-512, AVX2) against the scalar reference adamw_update, bit for bit, and the
// float -> bf16/fp16 rounding against fixed cases and the CPU's own F16C conversion.
#include "shardtrain/kernels/adamw_host.h"

#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "grad_check.h"
#include "shardtrain/core/error.h"
#include "shardtrain/core/rng.h"

namespace st {
namespace {

using testing::randn;

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
float from_bits(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

struct State {
  std::vector<float> p, m, v, g;
  State(int64_t n, uint64_t stream)
      : p(randn(n, stream, 0.05f)), m(randn(n, stream + 1, 0.01f)), g(randn(n, stream + 3)) {
    v = randn(n, stream + 2, 0.01f);
    for (float& x : v) x = x * x;  // second moments are non-negative
  }
};

AdamWParams params(float wd, int64_t step) {
  AdamWParams a;
  a.lr = 3e-3f;
  a.weight_decay = wd;
  a.step = step;
  a.grad_scale = 0.37f;  // a clip coefficient
  return a;
}

// Elements from p to the next 64-byte boundary (p is float-aligned).
int64_t elements_before_64(const float* p) {
  const uintptr_t mis = reinterpret_cast<uintptr_t>(p) % 64;
  return mis == 0 ? 0 : static_cast<int64_t>((64 - mis) / sizeof(float));
}

const SimdIsa kIsas[] = {SimdIsa::kScalar, SimdIsa::kAvx2, SimdIsa::kAvx512};

// Every length 0..40 (every tail mod 8 and mod 16, and lengths below one vector), plus larger odd ones, two
// steps, with and without decay, every output kind: param, m, v and the rounded copy are bit-identical to the
// scalar reference's.
TEST(AdamWHost, EveryIsaIsBitIdenticalToTheReference) {
  std::vector<int64_t> lengths;
  for (int64_t n = 0; n <= 40; ++n) lengths.push_back(n);
  for (int64_t n : {1000, 1023, 4097, 65541}) lengths.push_back(n);
  int checked_isas = 0;
  for (SimdIsa isa : kIsas) {
    if (!simd_isa_supported(isa)) continue;
    ++checked_isas;
    for (int64_t n : lengths) {
      for (HalfKind kind : {HalfKind::kNone, HalfKind::kBF16, HalfKind::kF16}) {
        SCOPED_TRACE(::testing::Message() << to_string(isa) << " n=" << n << " kind=" << static_cast<int>(kind));
        State want(n, 100 + static_cast<uint64_t>(n)), got = want;
        std::vector<uint16_t> out(static_cast<size_t>(n) + 1, 0xabcd);  // one guard element past the end
        for (int64_t step : {1, 2}) {
          const AdamWParams a = params(step == 1 ? 0.1f : 0.0f, step);
          adamw_update(want.p.data(), want.m.data(), want.v.data(), want.g.data(), n, a);
          adamw_update_isa(isa, got.p.data(), got.m.data(), got.v.data(), got.g.data(), n, a, kind, out.data());
        }
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(bits(got.p[i]), bits(want.p[i])) << "param " << i;
          ASSERT_EQ(bits(got.m[i]), bits(want.m[i])) << "m " << i;
          ASSERT_EQ(bits(got.v[i]), bits(want.v[i])) << "v " << i;
          if (kind != HalfKind::kNone) {
            const uint16_t r = kind == HalfKind::kBF16 ? round_to_bf16(want.p[i]) : round_to_f16(want.p[i]);
            ASSERT_EQ(out[i], r) << "rounded copy " << i;
          }
        }
        EXPECT_EQ(out[static_cast<size_t>(n)], 0xabcd) << "wrote past the end";
      }
    }
  }
  EXPECT_GE(checked_isas, 1);
}

// Out of place (what offload's speculative step does): the inputs stay as they were, and the outputs are the
// in-place update's bits, on every ISA and tail length.
TEST(AdamWHost, OutOfPlaceWritesTheInPlaceBitsAndLeavesTheInputs) {
  for (SimdIsa isa : kIsas) {
    if (!simd_isa_supported(isa)) continue;
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 33, 1001}) {
      SCOPED_TRACE(::testing::Message() << to_string(isa) << " n=" << n);
      const State before(n, 300 + static_cast<uint64_t>(n));
      State in_place = before, src = before, dst(n, 999);
      std::vector<uint16_t> out_a(static_cast<size_t>(n) + 1), out_b(static_cast<size_t>(n) + 1);
      const AdamWParams a = params(0.1f, 3);
      adamw_update_isa(isa, in_place.p.data(), in_place.m.data(), in_place.v.data(), in_place.g.data(), n, a,
                       HalfKind::kBF16, out_a.data());
      const AdamWArrays arrays{src.p.data(), src.m.data(), src.v.data(), dst.p.data(), dst.m.data(), dst.v.data()};
      adamw_update_isa(isa, arrays, src.g.data(), n, a, HalfKind::kBF16, out_b.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(bits(dst.p[i]), bits(in_place.p[i])) << i;
        ASSERT_EQ(bits(dst.m[i]), bits(in_place.m[i])) << i;
        ASSERT_EQ(bits(dst.v[i]), bits(in_place.v[i])) << i;
        ASSERT_EQ(out_b[i], out_a[i]) << i;
        ASSERT_EQ(bits(src.p[i]), bits(before.p[i])) << i;
        ASSERT_EQ(bits(src.m[i]), bits(before.m[i])) << i;
        ASSERT_EQ(bits(src.v[i]), bits(before.v[i])) << i;
      }
    }
  }
}

// Out of place at every alignment: the outputs start 0..16 elements past a 64-byte boundary, all at one offset
// (the streaming-store path: a scalar head up to the boundary, then aligned vectors) or each at its own (plain
// stores), with the half copy aligned or not. The bits equal the in-place update's, and nothing is written
// before or after the outputs.
TEST(AdamWHost, OutOfPlaceAtEveryAlignmentGivesTheInPlaceBits) {
  constexpr int64_t kGuard = 32;
  for (SimdIsa isa : kIsas) {
    if (!simd_isa_supported(isa)) continue;
    for (int64_t n : {1, 5, 16, 31, 100, 1001}) {
      const State before(n, 500 + static_cast<uint64_t>(n));
      State in_place = before;
      std::vector<uint16_t> want_out(static_cast<size_t>(n));
      const AdamWParams a = params(0.1f, 2);
      adamw_update_isa(isa, in_place.p.data(), in_place.m.data(), in_place.v.data(), in_place.g.data(), n, a,
                       HalfKind::kBF16, want_out.data());
      for (int64_t shift = 0; shift <= 16; ++shift) {
        for (bool same : {true, false}) {
          SCOPED_TRACE(::testing::Message() << to_string(isa) << " n=" << n << " shift=" << shift << " same=" << same);
          // 64-byte aligned backing stores (over-allocated and aligned by hand), the outputs at the offsets.
          std::vector<float> store(static_cast<size_t>(3 * (n + 2 * kGuard + 16) + 16), -7.0f);
          float* base = store.data() + elements_before_64(store.data());
          float* outs[3];
          for (int k = 0; k < 3; ++k)
            outs[k] = base + k * (n + 2 * kGuard + 16) + kGuard + (same ? shift : (shift + 5 * k) % 17);
          std::vector<uint16_t> half(static_cast<size_t>(n + 2 * kGuard + 16), 0xabcd);
          uint16_t* out = half.data() + kGuard + shift;
          const AdamWArrays arrays{before.p.data(), before.m.data(), before.v.data(), outs[0], outs[1], outs[2]};
          adamw_update_isa(isa, arrays, before.g.data(), n, a, HalfKind::kBF16, out);
          for (int64_t i = 0; i < n; ++i) {
            ASSERT_EQ(bits(outs[0][i]), bits(in_place.p[i])) << i;
            ASSERT_EQ(bits(outs[1][i]), bits(in_place.m[i])) << i;
            ASSERT_EQ(bits(outs[2][i]), bits(in_place.v[i])) << i;
            ASSERT_EQ(out[i], want_out[static_cast<size_t>(i)]) << i;
          }
          for (int k = 0; k < 3; ++k) {
            ASSERT_EQ(outs[k][-1], -7.0f) << "wrote before output " << k;
            ASSERT_EQ(outs[k][n], -7.0f) << "wrote past output " << k;
          }
          ASSERT_EQ(out[-1], 0xabcd);
          ASSERT_EQ(out[n], 0xabcd);
        }
      }
    }
  }
}

// Non-finite gradients propagate the same way on every ISA (NaN params round to the canonical 0x7fff).
TEST(AdamWHost, NonFiniteGradientsGiveTheSameBits) {
  const int64_t n = 37;
  for (SimdIsa isa : kIsas) {
    if (!simd_isa_supported(isa)) continue;
    SCOPED_TRACE(to_string(isa));
    State want(n, 7), got = want;
    want.g[3] = got.g[3] = std::numeric_limits<float>::quiet_NaN();
    want.g[20] = got.g[20] = std::numeric_limits<float>::infinity();
    std::vector<uint16_t> out(n);
    adamw_update(want.p.data(), want.m.data(), want.v.data(), want.g.data(), n, params(0.1f, 1));
    adamw_update_isa(isa, got.p.data(), got.m.data(), got.v.data(), got.g.data(), n, params(0.1f, 1), HalfKind::kBF16,
                     out.data());
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_EQ(std::isnan(got.p[i]), std::isnan(want.p[i])) << i;
      if (!std::isnan(want.p[i])) EXPECT_EQ(bits(got.p[i]), bits(want.p[i])) << i;
      EXPECT_EQ(out[i], round_to_bf16(want.p[i])) << i;
    }
    EXPECT_EQ(out[3], 0x7fff);
  }
}

TEST(AdamWHost, RoundToBf16IsNearestEven) {
  EXPECT_EQ(round_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(round_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(round_to_bf16(from_bits(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(round_to_bf16(from_bits(0x3f818000)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(round_to_bf16(from_bits(0x3f808001)), 0x3f81);  // above the tie
  EXPECT_EQ(round_to_bf16(from_bits(0x7f7fffff)), 0x7f80);  // FLT_MAX overflows to infinity
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::quiet_NaN()), 0x7fff);
  EXPECT_EQ(round_to_bf16(from_bits(0x00000001)), 0x0000);  // denormals round like any other value
}

TEST(AdamWHost, RoundToF16FixedCases) {
  EXPECT_EQ(round_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(round_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(round_to_f16(65504.0f), 0x7bff);               // largest half
  EXPECT_EQ(round_to_f16(65519.0f), 0x7bff);               // below the midpoint to 2^16
  EXPECT_EQ(round_to_f16(65520.0f), 0x7c00);               // the midpoint rounds (to even) to infinity
  EXPECT_EQ(round_to_f16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(round_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and it: even
  EXPECT_EQ(round_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // tie between 1 and 2: even
  EXPECT_EQ(round_to_f16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(round_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(round_to_f16(std::numeric_limits<float>::quiet_NaN()), 0x7fff);
}

// The bulk rounding (on every core above the parallel threshold) gives each element's scalar rounding, NaN and
// infinities among them, and refuses a kind that is not a half.
TEST(AdamWHost, RoundToHalfIsTheScalarRoundingOfEachElement) {
  Rng rng(9, 0);
  std::vector<float> in(100003);
  for (float& x : in) x = from_bits(static_cast<uint32_t>(rng.next_u64()));
  in[7] = std::numeric_limits<float>::quiet_NaN();
  in[8] = -std::numeric_limits<float>::infinity();
  std::vector<uint16_t> out(in.size());
  for (const HalfKind kind : {HalfKind::kBF16, HalfKind::kF16}) {
    round_to_half(in.data(), static_cast<int64_t>(in.size()), kind, out.data());
    for (size_t i = 0; i < in.size(); ++i)
      ASSERT_EQ(out[i], kind == HalfKind::kBF16 ? round_to_bf16(in[i]) : round_to_f16(in[i])) << i;
  }
  EXPECT_THROW(round_to_half(in.data(), 4, HalfKind::kNone, out.data()), Error);
}

// The bulk widening gives each of the 65,536 bit patterns its scalar value (the bits themselves for NaNs), in both
// kinds, and refuses a kind that is not a half.
TEST(AdamWHost, WidenHalfIsTheScalarWideningOfEachPattern) {
  std::vector<uint16_t> in(65536);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint16_t>(i);
  std::vector<float> out(in.size());
  for (const HalfKind kind : {HalfKind::kBF16, HalfKind::kF16}) {
    widen_half(in.data(), static_cast<int64_t>(in.size()), kind, out.data());
    for (size_t i = 0; i < in.size(); ++i)
      ASSERT_EQ(bits(out[i]), bits(kind == HalfKind::kBF16 ? bf16_to_float(in[i]) : f16_to_float(in[i])))
          << std::hex << "bits 0x" << i;
  }
  EXPECT_EQ(bits(out[0x3c00]), bits(1.0f));  // fp16 1.0
  EXPECT_THROW(widen_half(in.data(), 4, HalfKind::kNone, out.data()), Error);
}

__attribute__((target("f16c"))) uint16_t hardware_f16(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// The software rounding against the CPU's F16C instruction on a million random bit patterns (every exponent,
// so subnormal, normal, overflowing and tie cases all occur), NaNs aside.
TEST(AdamWHost, RoundToF16MatchesF16c) {
  if (!simd_isa_supported(SimdIsa::kAvx2)) GTEST_SKIP() << "this CPU has no F16C";
  Rng rng(5, 0);
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t u = static_cast<uint32_t>(rng.next_u64());
    const float x = from_bits(u);
    if (std::isnan(x)) continue;
    ASSERT_EQ(round_to_f16(x), hardware_f16(x)) << std::hex << "bits 0x" << u;
  }
}

}  // namespace
}  // namespace st
