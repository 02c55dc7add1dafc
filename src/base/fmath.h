// Deterministic f32 math shared by the CPU reference and the CUDA kernels [reference-defining].
// Both executors must produce the same bits, so transcendentals are our own polynomial code built
// from IEEE-rounded +, -, *, / and sqrt (never FMA: contraction is blocked explicitly with the
// FB_ADD/FB_MUL helpers on the device and -ffp-contract=off on the host), and every long
// reduction follows one of the canonical orders below, which map onto a CUDA warp.
//
// Canonical orders (docs/numerics.md):
//  * lanes32(n): element k goes to lane (k / 8) % 32; each lane sums its elements in increasing k;
//    the 32 lane sums are combined by a butterfly: for off in 16, 8, 4, 2, 1: v[i] = v[i] + v[i^off].
//  * blocks16 (block-scaled FP8/FP4 GEMM, K blocks of 32): block b goes to pair p = b % 16; each
//    half block (16 elements) is summed sequentially, dot_b = half0 + half1, and pair p
//    accumulates acc_p = acc_p + dot_b * scale_b in increasing b; pairs combined by a butterfly
//    with offsets 8, 4, 2, 1.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FB_HD __host__ __device__ __forceinline__
#else
#define FB_HD inline
#endif

namespace fb::fm {

FB_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FB_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FB_HD float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
FB_HD float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return __builtin_sqrtf(a);
#endif
}
FB_HD uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
FB_HD float from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// FP4 e2m1 code of v (spec/11 §1.5): thresholds on |v|, ties to the even code, v's sign bit
// copied (NaN -> magnitude 7). The one definition behind base/dtype.cpp's e2m1_from_f32 and the
// CUDA quantisers.
FB_HD uint8_t e2m1_code(float v) {
  const uint8_t sign = (bits(v) >> 31) ? 8 : 0;
  const float a = from_bits(bits(v) & 0x7FFFFFFFu);
  uint8_t m;
  if (a <= 0.25f) m = 0;
  else if (a < 0.75f) m = 1;
  else if (a <= 1.25f) m = 2;
  else if (a < 1.75f) m = 3;
  else if (a <= 2.5f) m = 4;
  else if (a < 3.5f) m = 5;
  else if (a <= 5.0f) m = 6;
  else m = 7;
  return uint8_t(sign | m);
}

// 2^n for integer n in [-149, 127], exact (subnormals built from two factors).
FB_HD float pow2i(int n) {
  if (n >= -126) return from_bits(uint32_t(n + 127) << 23);
  return from_bits(uint32_t(1) << (n + 149));
}

// e^x, |error| < 2 ulp on the normal range; exp(-inf) = 0, exp(+inf) = inf, NaN -> NaN.
FB_HD float exp(float x) {
  if (x != x) return x;
  if (x > 88.72283935546875f) return from_bits(0x7F800000u);
  if (x < -103.97208404541016f) return 0.0f;
  // x = n ln2 + r, |r| <= ln2/2, ln2 split so n*ln2_hi is exact.
  const float kLog2e = 1.44269502162933349609f;
  float t = mul(x, kLog2e);
  int n = int(add(t, t >= 0.0f ? 0.5f : -0.5f));
  const float kLn2Hi = 0.693145751953125f;    // 12 significant bits
  const float kLn2Lo = 1.428606765330187045e-06f;
  float fn = float(n);
  float r = add(add(x, -mul(fn, kLn2Hi)), -mul(fn, kLn2Lo));
  // e^r by a degree-7 Taylor polynomial in Horner form (|r| <= 0.347).
  float p = 1.9841269841e-4f;                 // 1/5040
  p = add(mul(p, r), 1.3888888889e-3f);       // 1/720
  p = add(mul(p, r), 8.3333333333e-3f);       // 1/120
  p = add(mul(p, r), 4.1666666667e-2f);       // 1/24
  p = add(mul(p, r), 1.6666666667e-1f);       // 1/6
  p = add(mul(p, r), 0.5f);
  p = add(mul(p, r), 1.0f);
  p = add(mul(p, r), 1.0f);
  // scale by 2^n in two steps so intermediate results stay normal
  if (n > 127) return mul(mul(p, pow2i(127)), pow2i(n - 127));
  if (n < -125) return mul(mul(p, pow2i(-125)), pow2i(n + 125));
  return mul(p, pow2i(n));
}

// ln(x) for x > 0 normal or subnormal; ln(0) = -inf; ln(inf) = inf; negative/NaN -> NaN.
FB_HD float log(float x) {
  if (!(x > 0.0f)) return x == 0.0f ? from_bits(0xFF800000u) : from_bits(0x7FC00000u);
  if (x == from_bits(0x7F800000u)) return x;
  uint32_t u = bits(x);
  int e = 0;
  if (u < 0x00800000u) {  // subnormal: scale up by 2^24
    x = mul(x, 16777216.0f);
    u = bits(x);
    e = -24;
  }
  e += int(u >> 23) - 127;
  float m = from_bits((u & 0x007FFFFFu) | 0x3F800000u);  // [1, 2)
  if (m > 1.41421356f) {
    m = mul(m, 0.5f);
    e += 1;
  }
  // ln(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716
  float s = div(add(m, -1.0f), add(m, 1.0f));
  float s2 = mul(s, s);
  float q = 0.0769230769f;                  // 1/13
  q = add(mul(q, s2), 0.0909090909f);       // 1/11
  q = add(mul(q, s2), 0.1111111111f);       // 1/9
  q = add(mul(q, s2), 0.1428571429f);       // 1/7
  q = add(mul(q, s2), 0.2f);
  q = add(mul(q, s2), 0.3333333333f);
  q = add(mul(q, s2), 1.0f);
  float lnm = mul(mul(2.0f, s), q);
  const float kLn2Hi = 0.693145751953125f;
  const float kLn2Lo = 1.428606765330187045e-06f;
  float fe = float(e);
  return add(add(mul(fe, kLn2Hi), lnm), mul(fe, kLn2Lo));
}

// ln(1 + y) for y >= 0 (softplus), with the usual correction for the rounding of 1 + y.
FB_HD float log1p(float y) {
  float u = add(1.0f, y);
  if (u == 1.0f) return y;
  float l = log(u);
  // correct for u - 1 != y
  return add(l, div(add(y, -add(u, -1.0f)), u));
}

FB_HD float sigmoid(float x) { return div(1.0f, add(1.0f, exp(-x))); }
FB_HD float silu(float x) { return div(x, add(1.0f, exp(-x))); }
FB_HD float rsqrt(float x) { return div(1.0f, sqrt_rn(x)); }
// torch softplus (beta 1, threshold 20)
FB_HD float softplus(float z) { return z > 20.0f ? z : log1p(exp(z)); }

// ---- canonical reductions (host side; the device mirrors them with warp shuffles) ----------
// Xor-butterfly sum of N lanes in place (the order of a warp's shuffle reduction over N lanes).
template <int N>
FB_HD float butterfly(float* v) {
  for (int off = N / 2; off >= 1; off >>= 1) {
    float t[N];
    for (int i = 0; i < N; ++i) t[i] = add(v[i], v[i ^ off]);
    for (int i = 0; i < N; ++i) v[i] = t[i];
  }
  return v[0];
}
FB_HD float butterfly32(float* v) { return butterfly<32>(v); }
FB_HD float butterfly16(float* v) { return butterfly<16>(v); }

// lanes32 order over n terms; term(k) must itself be computed without FMA.
template <typename F>
FB_HD float lanes32_sum(int64_t n, F term) {
  float v[32];
  for (int i = 0; i < 32; ++i) v[i] = 0.0f;
  for (int64_t k = 0; k < n; ++k) {
    const int lane = int((k >> 3) & 31);
    v[lane] = add(v[lane], term(k));
  }
  return butterfly32(v);
}

// blocks16 order for a block-scaled dot over KB blocks of 32: prod(k) is the (exact) product
// of element k, scale(b) the power-of-two scale of block b.
template <typename P, typename S>
FB_HD float blocks16_sum(int64_t KB, P prod, S scale) {
  float acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = 0.0f;
  for (int64_t b = 0; b < KB; ++b) {
    float h0 = 0.0f, h1 = 0.0f;
    for (int i = 0; i < 16; ++i) h0 = add(h0, prod(b * 32 + i));
    for (int i = 16; i < 32; ++i) h1 = add(h1, prod(b * 32 + i));
    const int p = int(b & 15);
    acc[p] = add(acc[p], mul(add(h0, h1), scale(b)));
  }
  return butterfly16(acc);
}

}  // namespace fb::fm
