// FP8: the two 8-bit float formats of Hopper and Ada tensor cores (OCP FP8, as CUDA's __nv_fp8_e4m3 and
// __nv_fp8_e5m2), and the scaled casts that feed FP8 GEMMs. The CPU reference of train.fp8: the GPU's casts give these
// bytes, and the CPU backend computes with the values they decode to.
//
//   E4M3: sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinity, NaN = S.1111.111; largest finite 448,
//         smallest normal 2^-6, smallest subnormal 2^-9.
//   E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits; IEEE-like (infinities, NaNs); largest finite 57344,
//         smallest normal 2^-14, smallest subnormal 2^-16.
//
// A cast rounds to nearest, ties to the even code, and saturates: a finite value beyond the largest finite one
// becomes it, with its sign (CUDA's __NV_SATFINITE, what cuBLASLt's FP8 outputs and our cast kernels use). Non-finite
// inputs are refused before any cast (kBadInput naming the tensor and the element); only the GPU's asynchronous form
// (kernels/gpu/fp8.h) lets them through, as NaN codes and scales.
//
// A scaled cast stores q = fp8(x * scale) and the GEMM multiplies its result by 1 / scale: scale = max / amax puts the
// tensor's (or row's) largest magnitude at the format's largest finite value, torchao's dynamic scaling:
//   fp8_quantize_matrix(x, rows, cols, Fp8Format::kE4M3, Fp8Scaling::kRow, true, Fp8Layout::kRowMajor, q, inverse,
//                       "attn.qkv input");
//   float back = fp8_decode(q[r * cols + c], Fp8Format::kE4M3) * inverse[r];
#pragma once

#include <cstdint>
#include <string>

namespace st {

enum class Fp8Format { kE4M3, kE5M2 };

// "e4m3", "e5m2".
const char* to_string(Fp8Format f);

// The largest finite value: 448 (E4M3), 57344 (E5M2).
float fp8_max(Fp8Format f);

// The code of x rounded to nearest (ties to even), saturated to the largest finite value; x finite.
uint8_t fp8_encode(float x, Fp8Format f);

// The value of a code (NaN for E4M3's and E5M2's NaN codes, +-infinity for E5M2's infinities).
float fp8_decode(uint8_t code, Fp8Format f);

// The scale that maps a largest magnitude `amax` onto fp8_max(f): fp8_max(f) / max(amax, 1e-12), in float (an amax of
// 0 gives a finite scale, and every code 0). With power_of_2 the scale is rounded down to a power of two (torchao's
// rowwise recipe), so that scaling and unscaling are exact.
float fp8_scale(float amax, Fp8Format f, bool power_of_2 = false);

// Which elements of a matrix share a scale: all of them (tensorwise), each row's, or each column's (rowwise recipes
// scale an activation per row and a weight along the dimension that is not summed over).
enum class Fp8Scaling { kTensor, kRow, kColumn };

// The group of element (r, c) of a [rows, cols] matrix, and how many groups there are.
inline int64_t fp8_group(Fp8Scaling s, int64_t r, int64_t c) {
  return s == Fp8Scaling::kTensor ? 0 : s == Fp8Scaling::kRow ? r : c;
}
inline int64_t fp8_groups(Fp8Scaling s, int64_t rows, int64_t cols) {
  return s == Fp8Scaling::kTensor ? 1 : s == Fp8Scaling::kRow ? rows : cols;
}

// Where a cast writes the code of x[r, c]: at q[r * cols + c] (x's own [rows, cols] layout), or at q[c * rows + r]
// (the transpose, [cols, rows]). FP8 GEMMs read both operands K-contiguous (kernels/fp8_gemm.h), so the backward's
// GEMMs take W^T (input gradient), dy^T and x^T (weight gradient) as transposed casts.
enum class Fp8Layout { kRowMajor, kTransposed };

// The FP8 operand of a GEMM: the code of x[r, c] is fp8_encode(x[r, c] * scale_g, f), written where `layout` puts
// it, with scale_g = fp8_scale(the group's largest magnitude, f, power_of_2) (the product in float), and
// inverse_scales[g] = 1 / scale_g (what cuBLASLt multiplies the product by), for the fp8_groups(s, rows, cols) groups.
// Groups are x's whatever the layout: kColumn with kTransposed gives one scale per row of the transposed codes.
// Refuses the first non-finite element (kBadInput: "<what>: element <i> is <value>; FP8 casts finite values only").
void fp8_quantize_matrix(const float* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling, bool power_of_2,
                         Fp8Layout layout, uint8_t* q, float* inverse_scales, const std::string& what);

// fp8_quantize_matrix in two halves, for an operand cast twice with the same groups (a layer's weight, forward and then
// transposed for the input gradient): fp8_maxima writes the groups' maxima (fp8_groups(scaling, rows, cols) of
// them, each the bits of the group's largest |x| as a float: bits of non-negative floats order as the floats), and
// fp8_quantize_with_maxima casts x with maxima so taken, in either layout; together they write fp8_quantize_matrix's
// bytes. fp8_maxima refuses a non-finite element as fp8_quantize_matrix does.
void fp8_maxima(const float* x, int64_t rows, int64_t cols, Fp8Scaling scaling, unsigned* maxima,
                const std::string& what);
void fp8_quantize_with_maxima(const float* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling,
                              bool power_of_2, Fp8Layout layout, const unsigned* maxima, uint8_t* q,
                              float* inverse_scales);

// Folds the tensorwise maximum of x [n] into *amax: *amax becomes the larger of itself and the bits of the largest
// |x[i]| as a float, so that from a zeroed *amax it holds fp8_maxima(x, 1, n, kTensor, ...)'s bits. Non-finite elements
// are not refused but fold like any other, as the GPU's maxima take them: an infinity's or a NaN's bits lie above every
// finite value's. The `amax` output of the kernels that write a linear layer's input (rmsnorm_forward, swiglu_forward,
// ...) is this, over what they write, so that its tensorwise cast needs no pass of its own:
//   unsigned amax = 0;
//   rmsnorm_forward(out, rstd, inp, weight, eps, N, C, &amax);   // amax == fp8_maxima of out [N, C], tensorwise
void fp8_fold_maximum(const float* x, int64_t n, unsigned* amax);

// A tensorwise cast with its maximum known ahead (train.fp8=delayed: the history's, model/fp8_history.h), so that the
// cast needs no pass over x for it: the codes of x [rows, cols] with scale fp8_scale(amax, f) (amax: *amax's bits as
// a float; not a power of two; 1 for a maximum of 0, Transformer Engine's scale of an operand that has been 0
// throughout its history), in x's layout into q and transposed into q_t (either may be null), 1 / scale into
// *inverse_scale, and x's own maximum folded into *own (may be null; fp8_fold_maximum) for the history to record. A
// non-finite element gets the NaN code (0x7f, either format), so that a GEMM reading it turns NaN as a tensorwise cast
// of it would; for a finite maximum > 0 the codes are otherwise fp8_quantize_with_maxima's. A non-finite *amax gives a
// NaN scale and every code NaN's.
void fp8_quantize_ahead(const float* x, int64_t rows, int64_t cols, Fp8Format f, const unsigned* amax, uint8_t* q,
                        uint8_t* q_t, float* inverse_scale, unsigned* own);

// The maxima of k tensors each split into parts over `world` ranks (dist.fp8_gather, shard/fp8_gather.h): maxima
// [world, k] holds each rank's part's maximum (fp8_maxima's bits; 0 for no part). Writes each tensor's maximum, the
// largest of its parts' (out_maxima, k), and its inverse scale 1 / fp8_scale(that maximum, f, power_of_2)
// (inverse_scales, k): what fp8_quantize_matrix gives the whole tensor, so that each rank's cast of its part with
// that maximum (fp8_quantize_with_maxima) writes the whole tensor's codes.
void fp8_scales_of_parts(const unsigned* maxima, int world, int64_t k, Fp8Format f, bool power_of_2,
                         unsigned* out_maxima, float* inverse_scales);

// The codes q [rows, cols] transposed into out [cols, rows] (out[c * rows + r] = q[r * cols + c]): a weight's codes
// cast once (row-major, for the forward) as the input gradient's GEMM reads them. With one scale a tensor, the bytes
// of casting the transpose.
void fp8_transpose(const uint8_t* q, int64_t rows, int64_t cols, uint8_t* out);

// One of the two casts of fp8_quantize_pair: its format, its groups, and where its codes and inverse scales go.
struct Fp8Cast {
  Fp8Format format;
  Fp8Scaling scaling;
  uint8_t* q;
  float* inverse_scales;
};

// fp8_quantize_matrix twice on one x: `row_major` in x's layout, `transposed` transposed, each with its own format and
// groups, and the same power_of_2. A linear layer's backward reads its output gradient both ways (the input
// gradient's GEMM row-major, the weight gradient's transposed); the GPU form reads x once for both codes and takes the
// groups' maxima once where both casts group alike. Refuses a non-finite element as fp8_quantize_matrix does.
void fp8_quantize_pair(const float* x, int64_t rows, int64_t cols, bool power_of_2, const Fp8Cast& row_major,
                       const Fp8Cast& transposed, const std::string& what);

// fp8_quantize_pair with the groups' maxima already taken (fp8_maxima, or fp8_fold_maximum for kTensor): both casts
// group alike and take `maxima` (fp8_groups(scaling, rows, cols) of them), each with its own format.
void fp8_quantize_pair_with_maxima(const float* x, int64_t rows, int64_t cols, bool power_of_2,
                                   const Fp8Cast& row_major, const Fp8Cast& transposed, const unsigned* maxima);

// The row-major matrix x [rows, cols] as an FP8 GEMM computes with it: each element cast with its group's scale,
// fp8_scale(the group's abs_max, f, power_of_2), and multiplied by 1 / scale (the dequantisation factor cuBLASLt
// applies to the product). out may be x. Refuses a non-finite element as fp8_quantize_matrix does.
void fp8_round_trip(const float* x, int64_t rows, int64_t cols, Fp8Format f, Fp8Scaling scaling, bool power_of_2,
                    float* out, const std::string& what);

}  // namespace st
