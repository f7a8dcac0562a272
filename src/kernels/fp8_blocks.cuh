// Private to src/kernels/*.cu: FP8 codes written in both layouts from 8 x 8 blocks a thread holds in registers
// (kernels/rmsnorm.cu's fused cast). A thread issues all of its block's loads before any store (a store may alias
// the input, so the compiler cannot move a later load above it), turns each row of 8 elements into 8 codes (8 bytes),
// transposes the 8 x 8 bytes with byte permutes and stores each column's 8 codes as one 8-byte store. Laid out as 4 row
// groups x 8 lanes along a row a warp, each transposed store of the warp writes 32 consecutive bytes into each of 8
// rows of the codes (whole 32-byte sectors); 32 lanes along a row would write 8 bytes into each of 32 rows.
#pragma once

#include <cstdint>

#include "gpu_pack.cuh"

namespace st::gpu::kernels_internal {

// 8 bytes as two words: lo holds bytes 0-3, hi bytes 4-7.
struct Bytes8 {
  unsigned lo, hi;
};

// The 4 x 4 byte transpose of words a0..a3 (row i's bytes in ai): out[k] holds byte k of a0, a1, a2, a3.
__device__ __forceinline__ void transpose_4x4(unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned (&out)[4]) {
  const unsigned t0 = __byte_perm(a0, a1, 0x5140), t1 = __byte_perm(a2, a3, 0x5140);  // bytes 0 and 1, interleaved
  const unsigned t2 = __byte_perm(a0, a1, 0x7362), t3 = __byte_perm(a2, a3, 0x7362);  // bytes 2 and 3
  out[0] = __byte_perm(t0, t1, 0x5410);
  out[1] = __byte_perm(t0, t1, 0x7632);
  out[2] = __byte_perm(t2, t3, 0x5410);
  out[3] = __byte_perm(t2, t3, 0x7632);
}

// rows[i] = the 8 codes of row i; column k's 8 codes (rows 0 to 7) stored at out + k * ld, 8-byte aligned.
__device__ __forceinline__ void store_transposed_8x8(const Bytes8 (&rows)[8], uint8_t* out, int64_t ld) {
  unsigned lo_top[4], lo_bottom[4], hi_top[4], hi_bottom[4];
  transpose_4x4(rows[0].lo, rows[1].lo, rows[2].lo, rows[3].lo, lo_top);
  transpose_4x4(rows[4].lo, rows[5].lo, rows[6].lo, rows[7].lo, lo_bottom);
  transpose_4x4(rows[0].hi, rows[1].hi, rows[2].hi, rows[3].hi, hi_top);
  transpose_4x4(rows[4].hi, rows[5].hi, rows[6].hi, rows[7].hi, hi_bottom);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    *reinterpret_cast<uint2*>(out + k * ld) = make_uint2(lo_top[k], lo_bottom[k]);
    *reinterpret_cast<uint2*>(out + (k + 4) * ld) = make_uint2(hi_top[k], hi_bottom[k]);
  }
}

// 8 codes as the two words of their 8 bytes, byte k = code k.
__device__ __forceinline__ Bytes8 pack_codes(const uint8_t (&codes)[8]) {
  Bytes8 b{0, 0};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    b.lo |= static_cast<unsigned>(codes[k]) << (8 * k);
    b.hi |= static_cast<unsigned>(codes[k + 4]) << (8 * k);
  }
  return b;
}

// A row's 8 codes at out (8-byte aligned).
__device__ __forceinline__ void store_row_8(const Bytes8& b, uint8_t* out) {
  *reinterpret_cast<uint2*>(out) = make_uint2(b.lo, b.hi);
}

// The 8 rows of 8 elements from p on, rows ld apart (each row 8 elements aligned as one pack), loaded as they are
// stored (all loads issued before any use, and 32 registers for bf16 where floats would take 64); floats(i, v):
// row i's elements as floats.
template <typename T>
struct Rows8 {
  Pack<T, 8> row[8];
  __device__ __forceinline__ void load(const T* p, int64_t ld) {
#pragma unroll
    for (int i = 0; i < 8; ++i) row[i] = *reinterpret_cast<const Pack<T, 8>*>(p + i * ld);
  }
  __device__ __forceinline__ void floats(int i, float (&v)[8]) const {
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = to_f32(row[i].v[k]);
  }
};

}  // namespace st::gpu::kernels_internal
