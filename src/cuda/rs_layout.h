// The weight layout of the register-streamed GEMVs (rs_gemv.h), shared by the packing kernels,
// the GEMV kernels and a host test (tests/rs_layout_test.cpp). Plain C++ (host and device).
//
// A weight [N, K] is cut into units of (stripe of 16 rows, step of 64 k). In one warp's step, lane
// L = 4 g + t (g = L / 4, t = L % 4) holds exactly its A fragments of the four mma.m16n8k16 (f16)
// of the step: mma q (q = 0..3) covers k = 16 q .. 16 q + 15 of the step, and its fragment
// register p (p = 0..3) holds the pair of k values (k0, k0 + 1) of one row:
//   row = g + 8 (p & 1),  k0 = 16 q + 2 t + 8 (p >> 1)           (the PTX m16n8k16 A layout)
// so one 16-byte (MXFP4) or two 16-byte (FP8) loads per lane bring a whole step, the warp's loads
// are 512 contiguous bytes, and no shuffle or shared memory stands between the load and the mma.
//
// FP8 (e4m3): a unit is 1024 bytes; lane L's bytes [32 L, 32 L + 32): byte b is mma q = b / 8,
// register p = (b % 8) / 2, value (b % 2) of the pair. Each 16-bit half of a word is one pair,
// widened to f16x2 by one cvt.
//
// MXFP4 (e2m1): a unit is 512 bytes; lane L's word i (bytes [16 L + 4 i, +4)) holds mma q = i:
// the four pairs' eight codes. Pair p's first value sits in the low half, its second in the high
// half, each at the bit positions below (sign at SIGN[p], the three magnitude bits at MAG[p]..+2),
// chosen so the f16 of the code times 2^-14 (a code's magnitude bits e1 e0 m are exactly f16
// exponent bits 11..10 and mantissa bit 9; e = 0 is an f16 subnormal as it is an e2m1 one) takes
// one AND for p = 0, a shift and an AND for p = 1, and an AND, a multiply and an AND for p = 2, 3
// (nine integer ops for eight codes):
//   p = 0: mag 9..11, sign 15    (in place)
//   p = 1: mag 6..8,  sign 12    (<< 3)
//   p = 2: mag 0..2,  sign 13    (mag << 9, sign << 2: one multiply by 2^9 + 2^2)
//   p = 3: mag 3..5,  sign 14    (mag << 6, sign << 1: one multiply by 2^6 + 2^1)
// (No arrangement lets all four pairs decode with one shift each: {0, 1, 2, 6} does not tile 16
// bits; checked exhaustively.) The block scales of a unit (16 rows x 2 blocks of 32) are re-laid
// as 32 bytes: byte 4 g + 2 h + b = the scale of row g + 8 h, block b of the step, so lane (g, t)
// reads its four with one 4-byte load.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FB_RS_HD __host__ __device__ __forceinline__
#else
#define FB_RS_HD inline
#endif

namespace fb::cuda::rs {

constexpr int kStripe = 16;          // rows of a unit (the mma's m)
constexpr int kStepK = 64;           // k of a unit (four mma k16)
constexpr int kFp8UnitBytes = 1024;  // 16 x 64 e4m3
constexpr int kFp4UnitBytes = 512;   // 16 x 64 e2m1
constexpr int kFp4ScaleUnitBytes = 32;

// The (row within the stripe, k within the step) of fragment register p, value `which` (0: the
// pair's first), of lane L in mma q.
struct Src {
  int row, k;
};
FB_RS_HD Src fragment_src(int lane, int q, int p, int which) {
  const int g = lane >> 2, t = lane & 3;
  return Src{g + 8 * (p & 1), 16 * q + 2 * t + 8 * (p >> 1) + which};
}

// FP8: byte b (0..31) of lane L's 32 bytes.
FB_RS_HD Src fp8_byte_src(int lane, int b) { return fragment_src(lane, b / 8, (b % 8) / 2, b % 2); }

// MXFP4: the bit positions of pair p's codes in a word (the second value's at +16).
FB_RS_HD int fp4_mag_bit(int p) { return p == 0 ? 9 : p == 1 ? 6 : p == 2 ? 0 : 3; }
FB_RS_HD int fp4_sign_bit(int p) { return p == 0 ? 15 : p == 1 ? 12 : p == 2 ? 13 : 14; }

// The word of four pairs from their eight e2m1 codes (codes[2 p + which]).
FB_RS_HD uint32_t fp4_pack_word(const uint8_t* codes) {
  uint32_t w = 0;
  for (int p = 0; p < 4; ++p)
    for (int which = 0; which < 2; ++which) {
      const uint32_t c = codes[2 * p + which], base = 16u * uint32_t(which);
      w |= (c & 7u) << (base + uint32_t(fp4_mag_bit(p)));
      w |= ((c >> 3) & 1u) << (base + uint32_t(fp4_sign_bit(p)));
    }
  return w;
}

// Pair p of a word as f16x2 bits (low half = the first value), each the e2m1 value x 2^-14.
FB_RS_HD uint32_t fp4_pair_f16x2(uint32_t w, int p) {
  constexpr uint32_t kMag = 0x0E000E00u, kSign = 0x80008000u;
  switch (p) {
    case 0:
      return w & (kMag | kSign);
    case 1:
      return (w << 3) & (kMag | kSign);
    case 2:
      // the pair's bits alone, then one multiply makes the two shifted copies (<< 9 for the
      // magnitudes, << 2 for the signs): their set bits never meet, so the sum is their OR
      return ((w & 0x20072007u) * ((1u << 9) + (1u << 2))) & (kMag | kSign);
    default:
      // << 6 and << 1: the copies meet at bit 20 only (the first value's sign and the second's
      // low magnitude bit); the carry stops by bit 23, below every bit the mask keeps
      return ((w & 0x40384038u) * ((1u << 6) + (1u << 1))) & (kMag | kSign);
  }
}

// MXFP4 scales: byte j of lane (g, *)'s scale word: row g + 8 (j / 2), block j % 2 of the step.
FB_RS_HD int fp4_scale_row(int g, int j) { return g + 8 * (j / 2); }
FB_RS_HD int fp4_scale_block(int j) { return j % 2; }

}  // namespace fb::cuda::rs
