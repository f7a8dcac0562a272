#include "shardtrain/kernels/adamw_host.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <vector>

#include "parallel.h"
#include "shardtrain/core/elapsed.h"
#include "shardtrain/core/error.h"

// Built with -ffp-contract=off (CMakeLists.txt): a fused multiply-add would change the bits.
namespace st {
namespace {

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

constexpr uint16_t kCanonicalNaN = 0x7fff;  // what CUDA's conversions return for any NaN

bool aligned_to(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Elements before `p` reaches a `bytes` boundary (p is 4-byte aligned): where a vector loop whose stores must be
// aligned starts.
int64_t elements_to_boundary(const float* p, size_t bytes) {
  const uintptr_t mis = reinterpret_cast<uintptr_t>(p) % bytes;
  return mis == 0 ? 0 : static_cast<int64_t>((bytes - mis) / sizeof(float));
}

// Which outputs of a vector loop take streaming (non-temporal) stores: those the update only writes, that is the
// state written out of place (a speculative update) and the half copy, when each is aligned for the vector at
// the loop's first element. A streaming store skips the read-for-ownership a plain store pays for a line not in
// cache. On a 32-vCPU Xeon host at 16 threads they take an out-of-place update from 3.29 to 4.43 Gparam/s
// (docs/performance.md); an in-place update reads every line it writes, so it keeps plain stores for the state.
struct StreamStores {
  bool state = false, out = false;
  bool any() const { return state || out; }
};
StreamStores stream_stores(const AdamWArrays& a, const uint16_t* out, int64_t first, size_t vector_bytes) {
  StreamStores s;
  if (a.param_out == a.param) return s;
  s.state = aligned_to(a.param_out + first, vector_bytes) && aligned_to(a.m_out + first, vector_bytes) &&
            aligned_to(a.v_out + first, vector_bytes);
  s.out = out != nullptr && aligned_to(out + first, vector_bytes / 2);
  return s;
}

void scalar_update(const AdamWArrays& a, const float* grad, int64_t n, const AdamWScalars& s, HalfKind kind,
                   uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    float p = a.param[i], m = a.m[i], v = a.v[i];
    adamw_element(s, p, m, v, grad[i]);
    a.param_out[i] = p;
    a.m_out[i] = m;
    a.v_out[i] = v;
    if (kind == HalfKind::kBF16) out[i] = round_to_bf16(p);
    if (kind == HalfKind::kF16) out[i] = round_to_f16(p);
  }
}

// AVX2 (+F16C for the fp16 conversion): 8 lanes; the tail goes to the scalar loop.
__attribute__((target("avx2,f16c"))) void avx2_update(const AdamWArrays& a, const float* grad, int64_t n,
                                                      const AdamWScalars& s, HalfKind kind, uint16_t* out) {
  const __m256 gs = _mm256_set1_ps(s.gs), b1 = _mm256_set1_ps(s.b1), b2 = _mm256_set1_ps(s.b2);
  const __m256 omb1 = _mm256_set1_ps(s.omb1), omb2 = _mm256_set1_ps(s.omb2), bc2 = _mm256_set1_ps(s.bc2_sqrt);
  const __m256 eps = _mm256_set1_ps(s.eps), decay = _mm256_set1_ps(s.decay), step = _mm256_set1_ps(s.step_size);
  const __m256i nan16 = _mm256_set1_epi32(kCanonicalNaN), one = _mm256_set1_epi32(1),
                round = _mm256_set1_epi32(0x7fff);
  // Out of place, the scalar loop first takes the elements before param_out's 32-byte boundary.
  int64_t i = a.param_out == a.param ? 0 : std::min(n, elements_to_boundary(a.param_out, 32));
  scalar_update(a, grad, i, s, kind, out);
  const StreamStores nt = stream_stores(a, out, i, 32);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), gs);
    const __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(a.m + i)), _mm256_mul_ps(omb1, g));
    const __m256 vi =
        _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(a.v + i)), _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
    const __m256 p = _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(a.param + i), decay),
                                   _mm256_mul_ps(step, _mm256_div_ps(mi, denom)));
    if (nt.state) {
      _mm256_stream_ps(a.m_out + i, mi);
      _mm256_stream_ps(a.v_out + i, vi);
      _mm256_stream_ps(a.param_out + i, p);
    } else {
      _mm256_storeu_ps(a.m_out + i, mi);
      _mm256_storeu_ps(a.v_out + i, vi);
      _mm256_storeu_ps(a.param_out + i, p);
    }
    if (kind == HalfKind::kNone) continue;
    const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(p, p, _CMP_UNORD_Q));
    __m256i h;
    if (kind == HalfKind::kBF16) {
      const __m256i u = _mm256_castps_si256(p);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
      h = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, round), lsb), 16);
    } else {
      h = _mm256_cvtepu16_epi32(_mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    h = _mm256_blendv_epi8(h, nan16, is_nan);
    // 8 x u32 -> 8 x u16: pack within 128-bit lanes, then bring the two lanes' halves together.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
    if (nt.out)
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(packed));
    else
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(packed));
  }
  if (nt.any()) _mm_sfence();  // streaming stores are weakly ordered: visible before the job reports done
  scalar_update(a.offset(i), grad + i, n - i, s, kind, out == nullptr ? nullptr : out + i);
}

// AVX-512F: 16 lanes; the tail runs masked.
__attribute__((target("avx512f"))) void avx512_update(const AdamWArrays& a, const float* grad, int64_t n,
                                                      const AdamWScalars& s, HalfKind kind, uint16_t* out) {
  const __m512 gs = _mm512_set1_ps(s.gs), b1 = _mm512_set1_ps(s.b1), b2 = _mm512_set1_ps(s.b2);
  const __m512 omb1 = _mm512_set1_ps(s.omb1), omb2 = _mm512_set1_ps(s.omb2), bc2 = _mm512_set1_ps(s.bc2_sqrt);
  const __m512 eps = _mm512_set1_ps(s.eps), decay = _mm512_set1_ps(s.decay), step = _mm512_set1_ps(s.step_size);
  const __m512i nan16 = _mm512_set1_epi32(kCanonicalNaN), one = _mm512_set1_epi32(1),
                round = _mm512_set1_epi32(0x7fff);
  const __m512 zero = _mm512_setzero_ps();
  // Out of place, the scalar loop first takes the elements before param_out's 64-byte boundary; streaming stores
  // then go to full, aligned vectors only (the masked tail stores plainly).
  const int64_t first = a.param_out == a.param ? 0 : std::min(n, elements_to_boundary(a.param_out, 64));
  scalar_update(a, grad, first, s, kind, out);
  const StreamStores nt = stream_stores(a, out, first, 64);
  for (int64_t i = first; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - i)) - 1);
    const bool full = k == 0xffff;
    const __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, grad + i), gs);
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(b1, _mm512_maskz_loadu_ps(k, a.m + i)), _mm512_mul_ps(omb1, g));
    const __m512 vi =
        _mm512_add_ps(_mm512_mul_ps(b2, _mm512_maskz_loadu_ps(k, a.v + i)), _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
    const __m512 p = _mm512_sub_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, a.param + i), decay),
                                   _mm512_mul_ps(step, _mm512_div_ps(mi, denom)));
    if (nt.state && full) {
      _mm512_stream_ps(a.m_out + i, mi);
      _mm512_stream_ps(a.v_out + i, vi);
      _mm512_stream_ps(a.param_out + i, p);
    } else {
      _mm512_mask_storeu_ps(a.m_out + i, k, mi);
      _mm512_mask_storeu_ps(a.v_out + i, k, vi);
      _mm512_mask_storeu_ps(a.param_out + i, k, p);
    }
    if (kind == HalfKind::kNone) continue;
    const __mmask16 is_nan = _mm512_cmp_ps_mask(p, zero, _CMP_UNORD_Q);
    __m512i h;
    if (kind == HalfKind::kBF16) {
      const __m512i u = _mm512_castps_si512(p);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
      h = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, round), lsb), 16);
    } else {
      h = _mm512_cvtepu16_epi32(_mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    h = _mm512_mask_mov_epi32(h, is_nan, nan16);
    const __m256i packed = _mm512_cvtepi32_epi16(h);
    if (full && nt.out) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), packed);
    } else if (full) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
    } else {  // the tail: through a stack copy (a 16-bit masked store would need AVX512BW)
      alignas(32) uint16_t lanes[16];
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), packed);
      std::memcpy(out + i, lanes, sizeof(uint16_t) * static_cast<size_t>(n - i));
    }
  }
  if (nt.any()) _mm_sfence();  // streaming stores are weakly ordered: visible before the job reports done
}

}  // namespace

const char* to_string(SimdIsa isa) {
  switch (isa) {
    case SimdIsa::kScalar: return "scalar";
    case SimdIsa::kAvx2: return "avx2";
    case SimdIsa::kAvx512: return "avx512";
  }
  return "?";
}

bool simd_isa_supported(SimdIsa isa) {
  static const bool avx2 = (__builtin_cpu_init(), __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"));
  static const bool avx512 = (__builtin_cpu_init(), __builtin_cpu_supports("avx512f"));
  switch (isa) {
    case SimdIsa::kScalar: return true;
    case SimdIsa::kAvx2: return avx2;
    case SimdIsa::kAvx512: return avx512;
  }
  return false;
}

SimdIsa best_simd_isa() {
  if (simd_isa_supported(SimdIsa::kAvx512)) return SimdIsa::kAvx512;
  if (simd_isa_supported(SimdIsa::kAvx2)) return SimdIsa::kAvx2;
  return SimdIsa::kScalar;
}

SimdIsa fastest_simd_isa() {
  static const SimdIsa fastest = [] {
    constexpr int64_t kN = int64_t{1} << 20;  // 4 MiB an array: from memory, as in training
    std::vector<float> p(kN, 0.01f), m(kN, 0.0f), v(kN, 0.0f), g(kN, 0.001f);
    std::vector<uint16_t> out(kN);
    AdamWParams a;
    a.lr = 1e-4f;
    const SimdIsa isas[] = {SimdIsa::kScalar, SimdIsa::kAvx2, SimdIsa::kAvx512};
    double fastest_s[3] = {1e30, 1e30, 1e30};
    for (int rep = 0; rep < 5; ++rep) {  // interleaved, the fastest of 5 each: robust to a busy moment
      for (int k = 0; k < 3; ++k) {
        if (!simd_isa_supported(isas[k])) continue;
        const auto t0 = std::chrono::steady_clock::now();
        adamw_update_isa(isas[k], p.data(), m.data(), v.data(), g.data(), kN, a, HalfKind::kBF16, out.data());
        fastest_s[k] = std::min(fastest_s[k], seconds_since(t0));
      }
    }
    SimdIsa best = SimdIsa::kScalar;
    double best_s = fastest_s[0];
    for (int k = 1; k < 3; ++k)
      if (fastest_s[k] < best_s) best = isas[k], best_s = fastest_s[k];
    return best;
  }();
  return fastest;
}

uint16_t round_to_bf16(float x) {
  const uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return kCanonicalNaN;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The classic branchy round-to-nearest-even float -> half (F. Giesen's float_to_half_fast3_rtne).
uint16_t round_to_f16(float x) {
  uint32_t u = bits_of(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u >= 0x47800000u) return u > 0x7f800000u ? kCanonicalNaN : static_cast<uint16_t>(sign | 0x7c00u);  // >= 2^16
  if (u < 0x38800000u) {  // below the smallest normal half, 2^-14: let the FPU round at 2^-24 steps
    float f;
    std::memcpy(&f, &u, sizeof(f));
    f += 0.5f;
    return static_cast<uint16_t>(sign | (bits_of(f) - 0x3f000000u));
  }
  const uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000fffu + odd;  // re-bias the exponent (127 -> 15) and round to nearest even
  return static_cast<uint16_t>(sign | (u >> 13));
}

void round_to_half(const float* in, int64_t n, HalfKind kind, uint16_t* out) {
  ST_CHECK(kind == HalfKind::kBF16 || kind == HalfKind::kF16, "round_to_half needs bf16 or fp16");
  const bool bf = kind == HalfKind::kBF16;
#pragma omp parallel for schedule(static) if (n >= kernels_internal::kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) out[i] = bf ? round_to_bf16(in[i]) : round_to_f16(in[i]);
}

float bf16_to_float(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

float f16_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      uint32_t m = mant;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400u) == 0);
      bits = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void widen_half(const uint16_t* in, int64_t n, HalfKind kind, float* out) {
  ST_CHECK(kind == HalfKind::kBF16 || kind == HalfKind::kF16, "widen_half needs bf16 or fp16");
  if (kind == HalfKind::kF16) {
    for (int64_t i = 0; i < n; ++i) out[i] = f16_to_float(in[i]);
    return;
  }
  // bf16 is fp32's top half: a shift the compiler vectorises, where a call per element is not.
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(out + i, &bits, sizeof(bits));
  }
}

void adamw_update_isa(SimdIsa isa, const AdamWArrays& a, const float* grad, int64_t n, const AdamWParams& p,
                      HalfKind kind, uint16_t* out) {
  ST_CHECK(kind == HalfKind::kNone || out != nullptr, "adamw_update_isa: a half-precision copy needs `out`");
  ST_CHECK(simd_isa_supported(isa), "adamw_update_isa: this CPU cannot run ", to_string(isa));
  const AdamWScalars s = adamw_scalars(p);
  switch (isa) {
    case SimdIsa::kScalar: scalar_update(a, grad, n, s, kind, out); return;
    case SimdIsa::kAvx2: avx2_update(a, grad, n, s, kind, out); return;
    case SimdIsa::kAvx512: avx512_update(a, grad, n, s, kind, out); return;
  }
}

void adamw_update_isa(SimdIsa isa, float* param, float* m, float* v, const float* grad, int64_t n,
                      const AdamWParams& p, HalfKind kind, uint16_t* out) {
  adamw_update_isa(isa, AdamWArrays::in_place(param, m, v), grad, n, p, kind, out);
}

}  // namespace st
