// Quantisers and GEMMs of the CUDA executor: act_quant, the FP8/FP4 QDQ of the caches, and the
// block-scaled FP8 / MXFP4 / bf16 GEMMs. The GEMMs are GEMV-shaped: one warp per output column
// n, reading the weight row ONCE with 16-byte loads for up to 8 activation rows (M accumulators),
// lane 2p+h owning half h of the blocks b = p (mod 16) exactly as blocks16 prescribes, so every
// output keeps the per-element arithmetic order of cpu/ops.cpp (blocks16 / lanes32,
// base/fmath.h). The scalar kernels remain for unaligned or odd shapes.
#include <cuda_fp16.h>

#include <atomic>

#include "base/check.h"
#include "cuda/device.h"
#include "cuda/numerics.cuh"
#include "cuda/fast_small.h"
#include "cuda/pdl.cuh"
#include "cuda/ops.h"
#include "cuda/launch.cuh"

namespace fb::cuda {

using namespace dev;

namespace {

constexpr int kWarps = 8;  // warps per block for warp-per-output kernels
constexpr int kRound = 4;  // GEMV chunks whose weight loads a lane issues before using the first

inline unsigned blocks_for(int64_t n, int per) { return unsigned((n + per - 1) / per); }

// ---- quantisers --------------------------------------------------------------------------------

// Warp per (row, 32-block), lane j = element j: the same codes and scale as act_quant_kernel.
// The CPU's amax is a sequential smax from +0 over |x_j|; smax never lets a NaN in (0 < NaN is
// false), so it is the maximum of {+0} and the non-NaN |x_j|, all >= +0: any order gives the same
// bits, so a butterfly of smax over lanes (each lane starting from smax(0, |x_j|)) is exact.
__device__ __forceinline__ float warp_block_amax(float v) {
  float a = smax(0.0f, fabsf(v));
  for (int off = 16; off >= 1; off >>= 1) a = smax(a, __shfl_xor_sync(kFull, a, off));
  return a;
}

__global__ void act_quant_warp_kernel(const uint16_t* __restrict__ x, int64_t M, int64_t K, uint8_t* __restrict__ codes,
                                      float* __restrict__ scales) {
  const int64_t KB = K / 32, w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (w >= M * KB) return;  // whole warps
  const int lane = int(threadIdx.x & 31);
  const int64_t m = w / KB, b = w % KB, i = m * K + b * 32 + lane;
  const float v = bf(x[i]);
  const float s = fp8_block_scale(warp_block_amax(v));
  if (lane == 0) scales[m * KB + b] = s;
  codes[i] = e4m3_code(smin(smax(fm::div(v, s), -448.0f), 448.0f));
}

// fp8_qdq_kernel with a warp per (row, 32-block); in place (out == x) is safe: every lane reads
// before the shuffles, writes after.
__global__ void fp8_qdq_warp_kernel(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld, uint16_t* out) {
  pdl_trigger();  // PDL (pdl.cuh): plain stream order unless launched with the attribute
  pdl_wait();
  const int64_t KB = K / 32, w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (w >= M * KB) return;
  const int lane = int(threadIdx.x & 31);
  const int64_t m = w / KB, b = w % KB;
  const float v = bf(x[m * K + b * 32 + lane]);
  const float s = fp8_block_scale(warp_block_amax(v));
  const uint8_t sc = e8m0_code(s);
  const uint8_t code = e4m3_code(smin(smax(fm::div(v, s), -448.0f), 448.0f));
  if (compact) {
    compact[m * ld + b * 32 + lane] = code;
    if (lane == 0) compact[m * ld + K + b] = sc;
  }
  if (out) out[m * K + b * 32 + lane] = to_bf(fm::mul(e4m3_val(code), e8m0_val(sc)));
}

// FP4 QDQ of blocks of B elements, a thread per block: the scale from the block's largest
// magnitude (floored), the e2m1 codes packed into the compact row (B / 2 bytes at b * B / 2, the
// scale code after the K / 2 code bytes) and/or dequantised into out. kE8m0: blocks of 32 with a
// power-of-two e8m0 scale (rounded up from amax / 6); else blocks of 16 with an e4m3 scale.
template <bool kE8m0>
__global__ void fp4_qdq_kernel(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld, uint16_t* out) {
  constexpr int B = kE8m0 ? 32 : 16;
  const int64_t KB = K / B, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * KB) return;
  const int64_t m = i / KB, b = i % KB;
  const uint16_t* xb = x + m * K + b * B;
  float amax = 0.0f;
  for (int j = 0; j < B; ++j) amax = smax(amax, fabsf(bf(xb[j])));
  float s, sv;  // the scale the codes divide by, and the one they are dequantised with
  uint8_t sc;
  if constexpr (kE8m0) {
    amax = smax(amax, fm::mul(6.0f, fm::pow2i(-126)));
    s = pow2_ceil_bits(fm::mul(amax, __uint_as_float(0x3E2AAAABu)));  // f32(1/6)
    sc = e8m0_code(s);
    sv = e8m0_val(sc);
  } else {
    amax = smax(amax, fm::mul(6.0f, fm::pow2i(-9)));
    sc = e4m3_code(fm::div(amax, 6.0f));
    s = sv = e4m3_val(sc);
  }
  uint8_t packed[B / 2];
  for (int j = 0; j < B; j += 2) {
    const float v0 = smin(smax(fm::div(bf(xb[j]), s), -6.0f), 6.0f);
    const float v1 = smin(smax(fm::div(bf(xb[j + 1]), s), -6.0f), 6.0f);
    packed[j / 2] = uint8_t(e2m1_code(v0) | (e2m1_code(v1) << 4));
  }
  if (compact) {
    uint8_t* row = compact + m * ld;
    for (int j = 0; j < B / 2; ++j) row[b * (B / 2) + j] = packed[j];
    row[K / 2 + b] = sc;
  }
  if (out)
    for (int j = 0; j < B; ++j) out[m * K + b * B + j] = to_bf(fm::mul(e2m1_val(e2m1_code_at(packed, j)), sv));
}

__global__ void fp8_dequant_rows_kernel(const uint64_t* rows, int64_t n, int64_t K, uint16_t* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * K) return;
  const int64_t r = i / K, k = i % K;
  const uint8_t* row = reinterpret_cast<const uint8_t*>(rows[r]);
  out[i] = to_bf(fm::mul(e4m3_val(row[k]), e8m0_val(row[K + k / 32])));
}

// ---- GEMMs ---------------------------------------------------------------------------------------

// ---- vectorised GEMV kernels (same per-output arithmetic as the scalar kernels below) ----------

// Two e4m3 codes (low byte first) -> exact f32 values (e4m3 is a subset of f16; NaN stays NaN,
// and every NaN becomes 0x7FC0 at the bf16 store like the host's).
__device__ __forceinline__ void e4m3x2(uint32_t two, float& a, float& b) {
  uint32_t h;
  const uint16_t in = uint16_t(two & 0xFFFFu);
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(in));
  a = __half2float(__ushort_as_half(uint16_t(h & 0xFFFFu)));
  b = __half2float(__ushort_as_half(uint16_t(h >> 16)));
}
__device__ __forceinline__ void e4m3x16(const uint4& v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    e4m3x2(w[i], f[4 * i + 0], f[4 * i + 1]);
    e4m3x2(w[i] >> 16, f[4 * i + 2], f[4 * i + 3]);
  }
}
// FP8 weight x act_quant rows, blocks16. Warp = (row tile of MR rows, output n); the chunk c of
// lane L is bytes [c*512 + L*16, +16) of the row = half (L & 1) of block 16c + L/2.
template <int MR, bool FMA>
__global__ void __launch_bounds__(256) fp8_gemv_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t M,
                                                       const uint8_t* __restrict__ W, const uint8_t* __restrict__ S, int64_t N, int64_t K,
                                                       uint16_t* __restrict__ y) {
  const int64_t wid = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t tiles = (M + MR - 1) / MR;
  if (wid >= N * tiles) return;  // whole warps leave together
  const int64_t n = wid % N, m0 = (wid / N) * MR, KB = K / 32, chunks = (KB + 15) / 16;
  const int lane = int(threadIdx.x & 31), p = lane >> 1;
  const uint8_t* wr = W + n * K;
  const uint8_t* sr = S + (n / 32) * KB;
  float acc[MR];
#pragma unroll
  for (int r = 0; r < MR; ++r) acc[r] = 0.0f;
  for (int64_t c0 = 0; c0 < chunks; c0 += kRound) {
    // every load of the round first (kRound x 16 bytes of weight per lane in flight), then use
    uint4 wv[kRound];
    float ws[kRound];
#pragma unroll
    for (int q = 0; q < kRound; ++q) {
      const int64_t b = (c0 + q) * 16 + p;
      wv[q] = make_uint4(0, 0, 0, 0);
      ws[q] = 0.0f;
      if (b < KB) {
        wv[q] = __ldg(reinterpret_cast<const uint4*>(wr + (c0 + q) * 512 + lane * 16));
        ws[q] = e8m0_val(sr[b]);
      }
    }
#pragma unroll
    for (int q = 0; q < kRound; ++q) {
      const int64_t c = c0 + q, b = c * 16 + p;
      const bool live = b < KB;
      float wf[16];
      e4m3x16(wv[q], wf);
#pragma unroll
      for (int r = 0; r < MR; ++r) {
        const int64_t m = m0 + r;
        const bool on = live && m < M;
        float half = 0.0f;
        if (on) {
          const uint4 xv = __ldg(reinterpret_cast<const uint4*>(xc + m * K + c * 512 + lane * 16));
          float xf[16];
          e4m3x16(xv, xf);
#pragma unroll
          for (int i = 0; i < 16; ++i) half = FMA ? fma_exact_product(xf[i], wf[i], half) : fm::add(half, fm::mul(xf[i], wf[i]));
        }
        const float dot = fm::add(half, __shfl_xor_sync(kFull, half, 1));
        if (on) acc[r] = fm::add(acc[r], fm::mul(dot, fm::mul(xs[m * KB + b], ws[q])));
      }
    }
  }
#pragma unroll
  for (int r = 0; r < MR; ++r) {
    float a = acc[r];
    for (int off = 16; off >= 2; off >>= 1) a = fm::add(a, __shfl_xor_sync(kFull, a, off));
    if (lane == 0 && m0 + r < M) y[(m0 + r) * N + n] = to_bf(a);
  }
}

// MXFP4 x act_quant, blocks16, products in f16. An e4m3 x e2m1 product has <= 6 significant
// bits, |x * w| <= 448 * 6 and its lowest bit >= 2^-10, so x * (w * 2^-14) is EXACT in f16
// (lowest bit >= 2^-24, the f16 subnormal step) and in f32 after conversion. Sums of products all
// scaled by 2^-14 are the unscaled sums times 2^-14 bit for bit (no partial sum is an f32
// subnormal: every nonzero one is a multiple of 2^-24), so dot = (half0' + half1') * 2^14 is the
// CPU's half0 + half1 exactly and every later operation is the CPU's.
__device__ __forceinline__ __half2 u32_half2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, sizeof(h));
  return h;
}
// Nibbles at bits 0-3 and 16-19 of s -> f16x2 of their e2m1 values times 2^-14 (sign kept on 0):
// magnitude em m to the f16 exponent/mantissa bits 9-11, sign to bit 15.
__device__ __forceinline__ uint32_t e2m1x2_f16_scaled(uint32_t s) { return ((s << 9) & 0x0E000E00u) | ((s << 12) & 0x80008000u); }
// The two 16-element half-block sums (scaled by 2^-14) of one lane for weights a and b sharing x.
template <bool TWO>
__device__ __forceinline__ void fp4_half_sums(const uint4& xv, const uint2& wa, const uint2& wb, float& ha, float& hb) {
  const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
  const uint32_t aw[2] = {wa.x, wa.y}, bw[2] = {wb.x, wb.y};
  float pa[16], pb[16];
#pragma unroll
  for (int g = 0; g < 2; ++g)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      // elements 8g+j and 8g+j+4: x bytes j, j+4 of the 8-byte group; weight nibbles j, j+4 of word g
      const uint32_t x2 = __byte_perm(xw[2 * g], xw[2 * g + 1], uint32_t(j | ((j + 4) << 4)));
      uint32_t xh;
      asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(xh) : "h"(uint16_t(x2 & 0xFFFFu)));
      const __half2 xp = u32_half2(xh);
      const __half2 a = __hmul2_rn(xp, u32_half2(e2m1x2_f16_scaled(aw[g] >> (4 * j))));
      pa[8 * g + j] = __low2float(a);
      pa[8 * g + j + 4] = __high2float(a);
      if (TWO) {
        const __half2 b = __hmul2_rn(xp, u32_half2(e2m1x2_f16_scaled(bw[g] >> (4 * j))));
        pb[8 * g + j] = __low2float(b);
        pb[8 * g + j + 4] = __high2float(b);
      }
    }
  ha = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) ha = fm::add(ha, pa[i]);
  if (TWO) {
    hb = 0.0f;
#pragma unroll
    for (int i = 0; i < 16; ++i) hb = fm::add(hb, pb[i]);
  }
}

// Warp per (row m, two outputs): rows n0 = 2j, n1 = 2j + 1 of W (Wb == nullptr), or row j of Wa
// and row j of Wb (w1 and w3 of the same experts: one pass over x). Each lane issues the weight,
// scale and x loads of R = 2 chunks before the first use, with >= 4 blocks per SM (19.14 vs 19.45
// ms/token for 4 chunks at the 2 blocks/SM its 93 registers allowed: interleaved A/B on the
// H200, docs/history.md); lane L owns half (L & 1) of block 16c + L/2 exactly as fp4_gemv_kernel /
// blocks16.
__global__ void __launch_bounds__(256, 4) fp4_gemv2_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t M, int64_t x_div,
                                                        const uint8_t* __restrict__ Wa, const uint8_t* __restrict__ Sa,
                                                        const uint8_t* __restrict__ Wb, const uint8_t* __restrict__ Sb, int64_t N, int64_t K,
                                                        int64_t w_stride, int64_t s_stride, const int32_t* __restrict__ expert,
                                                        uint16_t* __restrict__ ya, uint16_t* __restrict__ yb) {
  constexpr int R = 2;
  const bool dual = Wb != nullptr;
  const int64_t per_row = dual ? N : (N + 1) / 2;
  const int64_t wid = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (wid >= M * per_row) return;  // whole warps leave together
  const int64_t m = wid / per_row, j = wid % per_row;
  const int64_t KB = K / 32, xm = m / x_div, chunks = (KB + 15) / 16;
  const int64_t e = expert ? expert[m] : 0;
  if (e < 0) return;  // a row of another wave of a tiered layer (whole warps: m is per warp)
  const int lane = int(threadIdx.x & 31), p = lane >> 1;
  const int64_t n0 = dual ? j : 2 * j, n1 = dual ? j : 2 * j + 1;
  const bool on1 = n1 < N;  // single mode, odd N: the second slot re-reads row n0 and is dropped
  const uint8_t* w0 = Wa + e * w_stride + n0 * (K / 2);
  const uint8_t* s0 = Sa + e * s_stride + n0 * KB;
  const uint8_t* w1 = (dual ? Wb : Wa) + e * w_stride + (on1 ? n1 : n0) * (K / 2);
  const uint8_t* s1 = (dual ? Sb : Sa) + e * s_stride + (on1 ? n1 : n0) * KB;
  const uint8_t* xr = xc + xm * K;
  const float* xsr = xs + xm * KB;
  float acc0 = 0.0f, acc1 = 0.0f;
  for (int64_t c0 = 0; c0 < chunks; c0 += R) {
    uint2 wa[R], wb[R];
    uint4 xv[R];
    float xsv[R];
    uint8_t sa[R], sb[R];
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const int64_t c = c0 + q, b = c * 16 + p;
      wa[q] = wb[q] = make_uint2(0, 0);
      xv[q] = make_uint4(0, 0, 0, 0);
      xsv[q] = 0.0f;
      sa[q] = sb[q] = 0;
      if (b < KB) {
        wa[q] = __ldg(reinterpret_cast<const uint2*>(w0 + c * 256 + lane * 8));
        wb[q] = __ldg(reinterpret_cast<const uint2*>(w1 + c * 256 + lane * 8));
        xv[q] = __ldg(reinterpret_cast<const uint4*>(xr + c * 512 + lane * 16));
        xsv[q] = xsr[b];
        sa[q] = s0[b];
        sb[q] = s1[b];
      }
    }
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const int64_t b = (c0 + q) * 16 + p;
      const bool live = b < KB;
      float h0 = 0.0f, h1 = 0.0f;
      if (live) fp4_half_sums<true>(xv[q], wa[q], wb[q], h0, h1);
      const float d0 = fm::mul(fm::add(h0, __shfl_xor_sync(kFull, h0, 1)), 16384.0f);
      const float d1 = fm::mul(fm::add(h1, __shfl_xor_sync(kFull, h1, 1)), 16384.0f);
      if (live) {
        acc0 = fm::add(acc0, fm::mul(d0, fm::mul(xsv[q], e8m0_val(sa[q]))));
        acc1 = fm::add(acc1, fm::mul(d1, fm::mul(xsv[q], e8m0_val(sb[q]))));
      }
    }
  }
  for (int off = 16; off >= 2; off >>= 1) {
    acc0 = fm::add(acc0, __shfl_xor_sync(kFull, acc0, off));
    acc1 = fm::add(acc1, __shfl_xor_sync(kFull, acc1, off));
  }
  if (lane != 0) return;
  ya[m * N + n0] = to_bf(acc0);
  if (dual) yb[m * N + n0] = to_bf(acc1);
  else if (on1) ya[m * N + n1] = to_bf(acc1);
}

// bf16 x bf16, lanes32: lane L owns k in [L*8 + 256c, +8), sequential in k, butterfly 16..1.
// Warp = (row tile, group g, output n); the weight row is read once for MR rows.
template <int MR>
__global__ void __launch_bounds__(256) bf16_gemv_kernel(const uint16_t* __restrict__ x, int64_t M, int64_t K, int64_t ldx,
                                                        const uint16_t* __restrict__ w, int64_t N, void* y, int64_t ldy, int mode, int64_t G,
                                                        int64_t gx, int64_t gw, int64_t gy) {
  const int64_t wid = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int64_t tiles = (M + MR - 1) / MR;
  if (wid >= tiles * G * N) return;
  const int64_t n = wid % N, g = (wid / N) % G, m0 = (wid / (N * G)) * MR;
  const int lane = int(threadIdx.x & 31);
  const uint16_t* wr = w + g * gw + n * K;
  float v[MR];
#pragma unroll
  for (int r = 0; r < MR; ++r) v[r] = 0.0f;
  for (int64_t base0 = int64_t(lane) * 8; base0 < K; base0 += 256 * kRound) {
    uint4 wv[kRound];
#pragma unroll
    for (int q = 0; q < kRound; ++q) {
      const int64_t base = base0 + 256 * q;
      wv[q] = base < K ? __ldg(reinterpret_cast<const uint4*>(wr + base)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int q = 0; q < kRound; ++q) {
      const int64_t base = base0 + 256 * q;
      if (base >= K) break;  // this lane's chunks are in increasing k: nothing after it either
      const uint32_t ww[4] = {wv[q].x, wv[q].y, wv[q].z, wv[q].w};
      float wf[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        wf[2 * i] = __uint_as_float(ww[i] << 16);
        wf[2 * i + 1] = __uint_as_float(ww[i] & 0xFFFF0000u);
      }
#pragma unroll
      for (int r = 0; r < MR; ++r) {
        const int64_t m = m0 + r;
        if (m < M) {
          const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + g * gx + m * ldx + base));
          const uint32_t xx[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            v[r] = fm::add(v[r], fm::mul(__uint_as_float(xx[i] << 16), wf[2 * i]));
            v[r] = fm::add(v[r], fm::mul(__uint_as_float(xx[i] & 0xFFFF0000u), wf[2 * i + 1]));
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < MR; ++r) {
    float a = v[r];
    for (int off = 16; off >= 1; off >>= 1) a = fm::add(a, __shfl_xor_sync(kFull, a, off));
    const int64_t m = m0 + r;
    if (lane != 0 || m >= M) continue;
    const int64_t at = g * gy + m * ldy + n;
    if (mode == 0) static_cast<uint16_t*>(y)[at] = to_bf(a);
    else if (mode == 1) static_cast<float*>(y)[at] = a;
    else static_cast<float*>(y)[at] = fm::add(static_cast<float*>(y)[at], a);
  }
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
inline int rows_per_warp(int64_t M) { return M <= 1 ? 1 : M <= 2 ? 2 : M <= 4 ? 4 : 8; }


__global__ void fp8_gemm_kernel(const uint8_t* xc, const float* xs, int64_t M, const uint8_t* W, const uint8_t* S, int64_t N, int64_t K,
                                uint16_t* y) {
  const int64_t o = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (o >= M * N) return;  // whole warps leave together
  const int64_t m = o / N, n = o % N, KB = K / 32;
  const uint8_t* xr = xc + m * K;
  const float* xsr = xs + m * KB;
  const uint8_t* wr = W + n * K;
  const uint8_t* sr = S + (n / 32) * KB;
  const float acc = warp_blocks16(
      KB, [&](int64_t k) { return fm::mul(e4m3_val(xr[k]), e4m3_val(wr[k])); },
      [&](int64_t b) { return fm::mul(xsr[b], e8m0_val(sr[b])); });
  if ((threadIdx.x & 31) == 0) y[o] = to_bf(acc);
}

__global__ void fp4_gemm_kernel(const uint8_t* xc, const float* xs, int64_t M, int64_t x_div, const uint8_t* W, const uint8_t* S, int64_t N,
                                int64_t K, int64_t w_stride, int64_t s_stride, const int32_t* expert, uint16_t* y) {
  const int64_t o = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (o >= M * N) return;
  const int64_t m = o / N, n = o % N, KB = K / 32, xm = m / x_div;
  const int64_t e = expert ? expert[m] : 0;
  if (e < 0) return;  // a row of another wave of a tiered layer (the warp's output)
  const uint8_t* xr = xc + xm * K;
  const float* xsr = xs + xm * KB;
  const uint8_t* wr = W + e * w_stride + n * (K / 2);
  const uint8_t* sr = S + e * s_stride + n * KB;
  const float acc = warp_blocks16(
      KB, [&](int64_t k) { return fm::mul(e4m3_val(xr[k]), e2m1_val(e2m1_code_at(wr, k))); },
      [&](int64_t b) { return fm::mul(xsr[b], e8m0_val(sr[b])); });
  if ((threadIdx.x & 31) == 0) y[o] = to_bf(acc);
}

__global__ void bf16_gemm_kernel(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, void* y, int64_t ldy,
                                 int mode, int64_t G, int64_t gx, int64_t gw, int64_t gy) {
  const int64_t o = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (o >= M * G * N) return;
  const int64_t n = o % N, g = (o / N) % G, m = o / (N * G);
  const uint16_t* xr = x + g * gx + m * ldx;
  const uint16_t* wr = w + g * gw + n * K;
  const float acc = warp_lanes32(K, [&](int64_t k) { return fm::mul(bf(xr[k]), bf(wr[k])); });
  if ((threadIdx.x & 31) != 0) return;
  const int64_t at = g * gy + m * ldy + n;
  if (mode == 0) static_cast<uint16_t*>(y)[at] = to_bf(acc);
  else if (mode == 1) static_cast<float*>(y)[at] = acc;
  else static_cast<float*>(y)[at] = fm::add(static_cast<float*>(y)[at], acc);
}

__global__ void scale_bf16_kernel(uint16_t* x, int64_t n, float s) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = to_bf(fm::mul(bf(x[i]), s));
}

}  // namespace

Status act_quant(const uint16_t* x, int64_t M, int64_t K, const QuantBuf& q, cudaStream_t st) {
  FB_CHECK(K % 32 == 0 && M * K <= q.capacity) << "act_quant M=" << M << " K=" << K << " capacity=" << q.capacity;
  if (M == 0) return Status();
  return launch_op("act_quant_warp_kernel", act_quant_warp_kernel, blocks_for(M * (K / 32), 8), 256, 0, st, x, M, K, q.codes, q.scales);
}

Status fp8_qdq(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld, uint16_t* out, cudaStream_t st) {
  FB_CHECK(K % 32 == 0);
  if (M == 0) return Status();
  return launch_op_pdl("fp8_qdq_warp_kernel", fast_pdl(), fp8_qdq_warp_kernel, dim3(blocks_for(M * (K / 32), 8)), dim3(256), 0, st, x, M, K, compact,
                       ld, out);
}

Status fp4_e8m0_qdq(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld, uint16_t* out, cudaStream_t st) {
  FB_CHECK(K % 32 == 0);
  if (M == 0) return Status();
  return launch_op("fp4_e8m0_qdq_kernel", fp4_qdq_kernel<true>, blocks_for(M * (K / 32), 128), 128, 0, st, x, M, K, compact, ld, out);
}

Status fp4_e4m3_qdq(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld, uint16_t* out, cudaStream_t st) {
  FB_CHECK(K % 16 == 0);
  if (M == 0) return Status();
  return launch_op("fp4_e4m3_qdq_kernel", fp4_qdq_kernel<false>, blocks_for(M * (K / 16), 128), 128, 0, st, x, M, K, compact, ld, out);
}

Status fp8_dequant_rows(const uint64_t* rows, int64_t n, int64_t K, uint16_t* out, cudaStream_t st) {
  if (n == 0) return Status();
  return launch_op("fp8_dequant_rows_kernel", fp8_dequant_rows_kernel, blocks_for(n * K, 256), 256, 0, st, rows, n, K, out);
}

namespace {
std::atomic<bool> g_fp8_gemv_fma{true};
}  // namespace

void set_fp8_gemv_fma(bool on) { g_fp8_gemv_fma.store(on, std::memory_order_relaxed); }

Status fp8_gemm_q(const QuantBuf& q, int64_t M, const Fp8W& w, uint16_t* y, cudaStream_t st) {
  FB_CHECK(w.K % 32 == 0 && w.w && w.s) << "fp8 gemm K=" << w.K;
  if (M == 0 || w.N == 0) return Status();
  if (aligned16(q.codes) && aligned16(w.w)) {
    const int mr = rows_per_warp(M);
    const int64_t warps = w.N * ((M + mr - 1) / mr);
    const unsigned grid = blocks_for(warps, kWarps);
    const bool fma = g_fp8_gemv_fma.load(std::memory_order_relaxed);
    auto launch = [&](auto kernel) { kernel<<<grid, 32 * kWarps, 0, st>>>(q.codes, q.scales, M, w.w, w.s, w.N, w.K, y); };
    if (mr == 1) fma ? launch(fp8_gemv_kernel<1, true>) : launch(fp8_gemv_kernel<1, false>);
    else if (mr == 2) fma ? launch(fp8_gemv_kernel<2, true>) : launch(fp8_gemv_kernel<2, false>);
    else if (mr == 4) fma ? launch(fp8_gemv_kernel<4, true>) : launch(fp8_gemv_kernel<4, false>);
    else fma ? launch(fp8_gemv_kernel<8, true>) : launch(fp8_gemv_kernel<8, false>);
    FB_CUDA_LAUNCHED("fp8_gemv_kernel");
    return Status();
  }
  return launch_op("fp8_gemm_kernel", fp8_gemm_kernel, blocks_for(M * w.N, kWarps), 32 * kWarps, 0, st, q.codes, q.scales, M, w.w, w.s, w.N, w.K, y);
}

Status fp8_gemm(const uint16_t* x, int64_t M, const Fp8W& w, uint16_t* y, const QuantBuf& q, cudaStream_t st) {
  FB_RETURN_IF_ERROR(act_quant(x, M, w.K, q, st));
  return fp8_gemm_q(q, M, w, y, st);
}

namespace {
bool fp4_vec_ok(const QuantBuf& q, const Fp4W& w) {
  return aligned16(q.codes) && (reinterpret_cast<uintptr_t>(w.w) & 7u) == 0 && w.w_stride % 8 == 0;
}
}  // namespace


Status fp4_gemm_q(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& w, const int32_t* expert, uint16_t* y, cudaStream_t st) {
  FB_CHECK(w.K % 32 == 0 && x_div >= 1 && w.w && w.s) << "fp4 gemm K=" << w.K;
  if (M == 0 || w.N == 0) return Status();
  if (fp4_vec_ok(q, w)) {
    return launch_op("fp4_gemv2_kernel", fp4_gemv2_kernel, blocks_for(M * ((w.N + 1) / 2), kWarps), 32 * kWarps, 0, st, q.codes, q.scales, M, x_div,
                     w.w, w.s, nullptr, nullptr, w.N, w.K, w.w_stride, w.s_stride, expert, y, nullptr);
  }
  return launch_op("fp4_gemm_kernel", fp4_gemm_kernel, blocks_for(M * w.N, kWarps), 32 * kWarps, 0, st, q.codes, q.scales, M, x_div, w.w, w.s, w.N,
                   w.K, w.w_stride, w.s_stride, expert, y);
}

Status fp4_gemm2_q(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, const Fp4W& wb, const int32_t* expert, uint16_t* ya,
                   uint16_t* yb, cudaStream_t st) {
  const bool same = wa.N == wb.N && wa.K == wb.K && wa.w_stride == wb.w_stride && wa.s_stride == wb.s_stride;
  if (!same || !fp4_vec_ok(q, wa) || !fp4_vec_ok(q, wb) || wa.K % 32 != 0 || x_div < 1 || !wb.w || !wb.s) {
    FB_RETURN_IF_ERROR(fp4_gemm_q(q, M, x_div, wa, expert, ya, st));
    return fp4_gemm_q(q, M, x_div, wb, expert, yb, st);
  }
  FB_CHECK(wa.w && wa.s) << "fp4 gemm2";
  if (M == 0 || wa.N == 0) return Status();
  return launch_op("fp4_gemv2_kernel", fp4_gemv2_kernel, blocks_for(M * wa.N, kWarps), 32 * kWarps, 0, st, q.codes, q.scales, M, x_div, wa.w, wa.s,
                   wb.w, wb.s, wa.N, wa.K, wa.w_stride, wa.s_stride, expert, ya, yb);
}

Status bf16_gemm(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, void* y, int64_t ldy, GemmOut out,
                 int64_t G, int64_t gx, int64_t gw, int64_t gy, cudaStream_t st) {
  if (M == 0 || N == 0 || G == 0) return Status();
  if (K % 8 == 0 && ldx % 8 == 0 && gx % 8 == 0 && gw % 8 == 0 && aligned16(x) && aligned16(w)) {
    const int mr = rows_per_warp(M);
    const int64_t warps = ((M + mr - 1) / mr) * G * N;
    const unsigned grid = blocks_for(warps, kWarps);
    const int mode = int(out);
    auto* kernel = mr == 1 ? bf16_gemv_kernel<1> : mr == 2 ? bf16_gemv_kernel<2> : mr == 4 ? bf16_gemv_kernel<4> : bf16_gemv_kernel<8>;
    return launch_op("bf16_gemv_kernel", kernel, grid, 32 * kWarps, 0, st, x, M, K, ldx, w, N, y, ldy, mode, G, gx, gw, gy);
  }
  return launch_op("bf16_gemm_kernel", bf16_gemm_kernel, blocks_for(M * G * N, kWarps), 32 * kWarps, 0, st, x, M, K, ldx, w, N, y, ldy, int(out), G,
                   gx, gw, gy);
}

Status scale_bf16(uint16_t* x, int64_t n, float s, cudaStream_t st) {
  if (n == 0) return Status();
  return launch_op("scale_bf16_kernel", scale_bf16_kernel, blocks_for(n, 256), 256, 0, st, x, n, s);
}

}  // namespace fb::cuda
