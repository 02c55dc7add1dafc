// Device side of the reference numerics: bf16/e4m3/e2m1/e8m0 codecs bit-identical to
// base/dtype.cpp, the act_quant scale rule of cpu/ops.cpp, and the canonical reduction orders of
// base/fmath.h mapped onto one warp (docs/numerics.md). Invariant: every function here returns
// the same bits as its host counterpart for every input, NaN masks included.
#pragma once

#include <cstdint>

#include "base/fmath.h"

namespace fb::cuda::dev {

constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ float bf(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
// base/dtype.h bf16_bits_from_f32: RNE, NaN -> 0x7FC0.
__device__ __forceinline__ uint16_t to_bf(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
__device__ __forceinline__ float round_bf16(float f) { return bf(to_bf(f)); }
// Eight bf16 values as one 16-byte store (dst 16-byte aligned).
__device__ __forceinline__ void store_bf16x8(uint16_t* dst, const uint16_t (&v)[8]) {
  uint4 pack;
  pack.x = uint32_t(v[0]) | uint32_t(v[1]) << 16;
  pack.y = uint32_t(v[2]) | uint32_t(v[3]) << 16;
  pack.z = uint32_t(v[4]) | uint32_t(v[5]) << 16;
  pack.w = uint32_t(v[6]) | uint32_t(v[7]) << 16;
  *reinterpret_cast<uint4*>(dst) = pack;
}
// c + a * b with ONE rounding, for operands whose product is exact in f32 (e4m3 x e4m3: at most
// 8 significant bits, |a * b| in [2^-18, 448^2], so never subnormal, never overflowing). Then
// round(a * b) = a * b and fm::add(c, fm::mul(a, b)) is this bit for bit (NaN in, NaN out; a zero
// product takes the sign rules of the add either way). Saves one issue slot per element.
__device__ __forceinline__ float fma_exact_product(float a, float b, float c) { return __fmaf_rn(a, b, c); }
// std::max / std::min semantics (first argument wins unless the second compares larger/smaller).
__device__ __forceinline__ float smax(float a, float b) { return a < b ? b : a; }
__device__ __forceinline__ float smin(float a, float b) { return b < a ? b : a; }

__device__ __forceinline__ float e4m3_val(uint8_t c) {
  const int e = (c >> 3) & 0xF, m = c & 7;
  float v;
  if (e == 0xF && m == 7) v = __uint_as_float(0x7FC00000u);
  else if (e == 0) v = float(m) * 0x1p-9f;
  else v = __uint_as_float(uint32_t(e - 7 + 127) << 23 | uint32_t(m) << 20);
  return (c & 0x80) ? -v : v;
}
__device__ __forceinline__ float e8m0_val(uint8_t c) {
  if (c == 0xFF) return __uint_as_float(0x7FC00000u);
  return fm::pow2i(int(c) - 127);
}
__device__ __forceinline__ float e2m1_val(uint8_t c) {
  const uint32_t mag = c & 7;
  // {0, .5, 1, 1.5, 2, 3, 4, 6}
  const float v = mag == 0 ? 0.0f : mag == 1 ? 0.5f : mag == 2 ? 1.0f : mag == 3 ? 1.5f : mag == 4 ? 2.0f : mag == 5 ? 3.0f : mag == 6 ? 4.0f : 6.0f;
  return (c & 8) ? -v : v;
}
__device__ __forceinline__ uint8_t e2m1_code_at(const uint8_t* packed, int64_t i) {
  const uint8_t b = packed[i >> 1];
  return (i & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xF);
}

// base/dtype.cpp e4m3_from_f32: RNE on the binade quantum, saturating to +-448, NaN -> 0x7F|s.
__device__ __forceinline__ uint8_t e4m3_code(float f) {
  const uint32_t u = __float_as_uint(f);
  const uint8_t sign = (u >> 24) & 0x80;
  if (f != f) return uint8_t(sign | 0x7F);
  const float a = fabsf(f);
  if (a >= 448.0f) return uint8_t(sign | 0x7E);
  int ex;
  frexpf(a, &ex);
  int e_unb = ex - 1;
  if (e_unb < -6) e_unb = -6;
  const float quantum = ldexpf(1.0f, e_unb - 3);
  const float q = rintf(fm::div(a, quantum));
  const float r = fm::mul(q, quantum);
  if (r == 0.0f) return sign;
  if (r >= 448.0f) return uint8_t(sign | 0x7E);
  int re;
  frexpf(r, &re);
  const int be = re - 1 + 7;
  if (be <= 0) return uint8_t(sign | int(fm::div(r, 0x1p-9f)));
  const int m = int(fm::mul(fm::add(fm::div(r, ldexpf(1.0f, re - 1)), -1.0f), 8.0f));
  return uint8_t(sign | (be << 3) | m);
}
// e2m1 code (spec/11 §1.5): the shared definition of base/fmath.h, as base/dtype.cpp uses.
using fm::e2m1_code;
// e8m0 byte of an exact power of two.
__device__ __forceinline__ uint8_t e8m0_code(float pow2) {
  const uint32_t u = __float_as_uint(pow2);
  const int e = int((u >> 23) & 0xFF);
  if (e == 0) return uint8_t(31 - __clz(u & 0x7FFFFF) - 22);  // subnormal 2^(bit - 149); only 2^-127 is valid
  return uint8_t(e);
}
// cpu/ops.cpp pow2_ceil_bits: rounds a positive f32 up to 2^k by its bit pattern.
__device__ __forceinline__ float pow2_ceil_bits(float t) {
  const uint32_t u = __float_as_uint(t);
  const int e = int((u >> 23) & 0xFF);
  const uint32_t m = u & 0x7FFFFF;
  const int k = e - 127 + (m != 0 ? 1 : 0);
  return ldexpf(1.0f, k);
}
__device__ __forceinline__ float fp8_block_scale(float amax) {
  amax = smax(amax, 1e-4f);
  return pow2_ceil_bits(fm::mul(amax, __uint_as_float(0x3B124925u)));  // f32(1/448)
}

// ---- canonical reductions on one warp (fmath.h lanes32_sum / blocks16_sum) -----------------
// lanes32: element k -> lane (k / 8) % 32, lane-sequential in k, butterfly 16, 8, 4, 2, 1.
// Every lane of the warp must call it; every lane returns the total.
template <typename F>
__device__ __forceinline__ float warp_lanes32(int64_t n, F term) {
  const int lane = int(threadIdx.x & 31);
  float v = 0.0f;
  for (int64_t base = int64_t(lane) * 8; base < n; base += 256) {
    const int64_t end = base + 8 < n ? base + 8 : n;
    for (int64_t k = base; k < end; ++k) v = fm::add(v, term(k));
  }
  for (int off = 16; off >= 1; off >>= 1) v = fm::add(v, __shfl_xor_sync(kFull, v, off));
  return v;
}
// warp_lanes32 of a[k] * b[k] over two bf16 vectors with 16-byte loads (n % 8 == 0, a and b
// 16-byte aligned): lane L's elements [L*8 + 256c, +8) in increasing k, four chunks' loads issued
// before the first use, then the butterfly: the same operations in the same order.
__device__ __forceinline__ void bf16x8_acc(float& v, const uint4& x, const uint4& y) {
  const uint32_t xw[4] = {x.x, x.y, x.z, x.w}, yw[4] = {y.x, y.y, y.z, y.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    v = fm::add(v, fm::mul(__uint_as_float(xw[e] << 16), __uint_as_float(yw[e] << 16)));
    v = fm::add(v, fm::mul(__uint_as_float(xw[e] & 0xFFFF0000u), __uint_as_float(yw[e] & 0xFFFF0000u)));
  }
}
__device__ __forceinline__ float warp_dot_bf16_vec(const uint16_t* a, const uint16_t* b, int64_t n) {
  const int lane = int(threadIdx.x & 31);
  float v = 0.0f;
  int64_t base = int64_t(lane) * 8;
  for (; base + 3 * 256 < n; base += 4 * 256) {
    uint4 x[4], y[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      x[q] = __ldg(reinterpret_cast<const uint4*>(a + base + q * 256));
      y[q] = __ldg(reinterpret_cast<const uint4*>(b + base + q * 256));
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) bf16x8_acc(v, x[q], y[q]);
  }
  for (; base < n; base += 256) bf16x8_acc(v, __ldg(reinterpret_cast<const uint4*>(a + base)), __ldg(reinterpret_cast<const uint4*>(b + base)));
  for (int off = 16; off >= 1; off >>= 1) v = fm::add(v, __shfl_xor_sync(kFull, v, off));
  return v;
}
// lanes32 over n values staged in shared memory: term(k) = f(s[k]), one warp, the same lane
// assignment and lane-sequential order as warp_lanes32. s must be 16-byte aligned.
template <typename F>
__device__ __forceinline__ float warp_lanes32_smem(const float* s, int64_t n, F f) {
  const int lane = int(threadIdx.x & 31);
  float v = 0.0f;
  if ((n & 7) == 0) {
#pragma unroll 4
    for (int64_t base = int64_t(lane) * 8; base < n; base += 256) {
      const float4 a = *reinterpret_cast<const float4*>(s + base);
      const float4 b = *reinterpret_cast<const float4*>(s + base + 4);
      v = fm::add(v, f(a.x));
      v = fm::add(v, f(a.y));
      v = fm::add(v, f(a.z));
      v = fm::add(v, f(a.w));
      v = fm::add(v, f(b.x));
      v = fm::add(v, f(b.y));
      v = fm::add(v, f(b.z));
      v = fm::add(v, f(b.w));
    }
  } else {
    for (int64_t base = int64_t(lane) * 8; base < n; base += 256) {
      const int64_t end = base + 8 < n ? base + 8 : n;
      for (int64_t k = base; k < end; ++k) v = fm::add(v, f(s[k]));
    }
  }
  for (int off = 16; off >= 1; off >>= 1) v = fm::add(v, __shfl_xor_sync(kFull, v, off));
  return v;
}
// blocks16: lanes 2p / 2p+1 sum the two 16-element halves of blocks b with b % 16 == p,
// dot = h0 + h1, acc_p += dot * scale(b) in increasing b; butterfly over lane xor 16, 8, 4, 2.
template <typename P, typename S>
__device__ __forceinline__ float warp_blocks16(int64_t KB, P prod, S scale) {
  const int lane = int(threadIdx.x & 31), p = lane >> 1, h = lane & 1;
  float acc = 0.0f;
  for (int64_t b0 = 0; b0 < KB; b0 += 16) {
    const int64_t b = b0 + p;
    float half = 0.0f;
    if (b < KB) {
      const int64_t k0 = b * 32 + h * 16;
#pragma unroll
      for (int i = 0; i < 16; ++i) half = fm::add(half, prod(k0 + i));
    }
    const float dot = fm::add(half, __shfl_xor_sync(kFull, half, 1));
    if (b < KB) acc = fm::add(acc, fm::mul(dot, scale(b)));
  }
  for (int off = 16; off >= 2; off >>= 1) acc = fm::add(acc, __shfl_xor_sync(kFull, acc, off));
  return acc;
}

}  // namespace fb::cuda::dev
