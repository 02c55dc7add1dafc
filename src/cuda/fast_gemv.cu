// The fast decode GEMVs of fast_gemv.h. Common shape of the three kernels:
//
//  * CTA = 8 warps; a "warp group" of ks warps computes C output columns (2 for FP8 and bf16, 4
//    weight rows for MXFP4: 4 columns, or 2 columns of w1 and of w3) for a chunk of R <= 8
//    activation rows (FP8, bf16) or for one row (MXFP4 experts: rows do not share weights). The ks
//    warps of a group split the K steps round robin (split-K inside the CTA only, for narrow N
//    where one warp per column group would leave HBM idle) and fold their partials through shared
//    memory in warp order. ks depends on (N, K[, G]) only.
//  * A step is 512 bytes of one weight row: lane L loads bytes [L*16, +16) with one 16-byte
//    load. Loads are double-buffered one group ahead (up to 8 16-byte loads per lane in flight,
//    4 KB per warp), the group after that is prefetched into L2, the first group is issued before
//    the activation tile is staged, and the CTAs are persistent (grid-stride over the column
//    groups, as many CTAs as are resident), so the staging is paid once per CTA.
//  * The activation rows are dequantised ONCE per CTA into shared memory as f32 (code * scale is
//    exact: <= 4 significant bits times a power of two) in a lane-interleaved layout that makes
//    every read a conflict-free 16-byte LDS. K longer than the tile is processed in tiles (then
//    re-staged per output pass).
//  * Per lane, per step: the decoded weights are multiplied into each row's f32 partial with
//    explicit __fmaf_rn in increasing k (the library is built with --fmad=false: nothing else
//    contracts), the partial of a 16- or 32-element block piece is scaled once by the weight
//    block's e8m0 scale into the row's accumulator (again one fma), then the warp's 32 lane sums
//    fold in a fixed xor butterfly and the ks warps' sums in warp order; one RNE rounding to bf16.
//
// Row invariance: the arithmetic of an output (m, n) is a function of (N, K[, G]) and of row m's
// operands only: the row chunk R, the number of chunks, the tile length and the grid size change
// which thread computes which row, never the order or the operations of the row's sum; there are
// no atomics and no cross-row reductions. M only picks R (1, 2, 4 or 8) and the number of chunks.
#include "cuda/fast_gemv.h"

#include <cuda_fp16.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "base/check.h"
#include <atomic>

#include "cuda/device.h"
#include "cuda/numerics.cuh"
#include "cuda/fast_small.h"
#include "cuda/pdl.cuh"
#include "cuda/rs_gemv.h"
#include "cuda/tc_gemv.h"
#include "cuda/launch.cuh"

namespace fb::cuda {

using dev::kFull;
using dev::to_bf;

namespace {

constexpr int kThreads = 256;
// Register cap for more resident warps (more weight bytes in flight): __launch_bounds__ min blocks
// per SM of the occupancy variant (ncu, 2026-12-01: the default variant runs 114-128 registers at
// 23% achieved occupancy). Same arithmetic either way (fast_gemv.h set_fast_gemv_occupancy).
constexpr int kOccBlocks = 3;
std::atomic<bool> g_fast_occupancy{false};
// Route the FP8 / MXFP4 GEMVs to the tensor-core kernels of tc_gemv.cu (set_fast_gemv_tc).
std::atomic<bool> g_fast_tc{false};
constexpr int kWarps = kThreads / 32;
// Steps whose weight loads a lane issues before it uses the first: 4 x 16 bytes per lane.
constexpr int kUnroll = 4;
// Shared memory for the staged activation tile of one CTA (f32): 64 KB lets three CTAs share an
// SM at R = 8 and holds a whole K <= 16384 row at R = 1 (one staging per CTA).
constexpr int64_t kTileBytes = 64 * 1024;
// Split K inside a CTA while fewer than this many warps would stream the weight (about 24 warps
// on each of the 132 SMs, each with 2 KB in flight, is what covers the HBM latency).
constexpr int64_t kWantWarps = 4096;

// ---- device helpers --------------------------------------------------------------------------

__device__ __forceinline__ __half2 bits_half2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, sizeof(h));
  return h;
}
// Four e4m3 codes (byte i = element i) -> exact f32 values (e4m3 is a subset of f16).
__device__ __forceinline__ void e4m3x4_f32(uint32_t w, float* f) {
  uint32_t lo, hi;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(lo) : "h"(uint16_t(w & 0xFFFFu)));
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(hi) : "h"(uint16_t(w >> 16)));
  const float2 a = __half22float2(bits_half2(lo)), b = __half22float2(bits_half2(hi));
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}
// Eight e2m1 codes (nibble i = element i, even element in the low nibble) -> f32 values times
// 2^-14, exactly: moving the magnitude bits to f16 bits 9-11 and the sign to bit 15 makes an f16
// whose exponent/mantissa are the e2m1 ones with the bias of f16 (15) in place of e2m1's (1), and
// magnitude 1 (0.5) lands on the f16 subnormal 2^-15. Nibbles j and j + 4 share one f16x2.
__device__ __forceinline__ void e2m1x8_f32_scaled(uint32_t w, float* f) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t s = w >> (4 * j);
    const uint32_t h = ((s << 9) & 0x0E000E00u) | ((s << 12) & 0x80008000u);
    const float2 v = __half22float2(bits_half2(h));
    f[j] = v.x;
    f[j + 4] = v.y;
  }
}
// e8m0 byte -> 2^(c - 127) (c = 0: the subnormal 2^-127; 0xFF: NaN), as numerics.cuh e8m0_val.
__device__ __forceinline__ float e8m0_f32(uint32_t c) { return __uint_as_float(c == 0 ? 0x00400000u : c == 0xFFu ? 0x7FC00000u : c << 23); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(kFull, v, off));
  return v;  // lane 0's value is the one used (every lane's is deterministic)
}

// Shared-memory position of tile element kk for E elements per lane per step (a step is 32 * E
// elements): element kk is lane L's element e of step s; lane L's 4-element group i sits at
// s * 32E + i * 128 + L * 4, so the 32 lanes' i-th 16-byte reads are contiguous (no bank conflict).
template <int E>
__device__ __forceinline__ int tile_index(int kk) {
  const int s = kk / (32 * E), w = kk % (32 * E);
  return s * 32 * E + ((w % E) / 4) * 128 + (w / E) * 4 + (w % 4);
}

// At most this many 16-byte source units per thread fill a tile (kTileBytes of f32 from 16 codes
// or 8 bf16 per unit): every thread issues all its loads before the first store, so staging costs
// one L2 round trip, not one per unit.
constexpr int kStageUnits = int(kTileBytes / 4 / 8 / kThreads);

// Stage rows x0 + r (r < R; rows r >= nv as zeros) of act_quant codes/scales, elements
// [k0, k0 + kt) (those >= K are never read), as exact f32 in the tile layout. E % 16 == 0: a
// unit of 16 codes is 4 consecutive 4-groups of one lane's piece and lies in one 32-block.
template <int R, int E>
__device__ __forceinline__ void stage_quant(float* sx, const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t x0, int nv, int K,
                                            int k0, int kt) {
  static_assert(E % 16 == 0, "a staging unit must stay inside one lane's piece");
  const int per_row = kt / 16, units = R * per_row;
  uint4 c[kStageUnits / 2];
  float sc[kStageUnits / 2];
#pragma unroll
  for (int j = 0; j < kStageUnits / 2; ++j) {
    const int u = threadIdx.x + j * kThreads, r = u / per_row, k = k0 + (u % per_row) * 16;
    c[j] = make_uint4(0, 0, 0, 0);
    sc[j] = 0.0f;
    if (u < units && r < nv && k < K) {
      c[j] = __ldg(reinterpret_cast<const uint4*>(xc + (x0 + r) * K + k));
      sc[j] = __ldg(xs + (x0 + r) * (K / 32) + k / 32);
    }
  }
#pragma unroll
  for (int j = 0; j < kStageUnits / 2; ++j) {
    const int u = threadIdx.x + j * kThreads, r = u / per_row, kk = (u % per_row) * 16;
    if (u >= units) break;
    const uint32_t cw[4] = {c[j].x, c[j].y, c[j].z, c[j].w};
    float* dst = sx + r * kt + tile_index<E>(kk);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float f[4];
      e4m3x4_f32(cw[i], f);
      *reinterpret_cast<float4*>(dst + i * 128) = make_float4(__fmul_rn(f[0], sc[j]), __fmul_rn(f[1], sc[j]), __fmul_rn(f[2], sc[j]), __fmul_rn(f[3], sc[j]));
    }
  }
}

// The same for bf16 rows (row stride ldx): 8 elements (one lane's piece of a step, E = 8) per unit;
// bf16 -> f32 is exact.
template <int R>
__device__ __forceinline__ void stage_bf16(float* sx, const uint16_t* __restrict__ x, int64_t ldx, int64_t x0, int nv, int K, int k0, int kt) {
  const int per_row = kt / 8, units = R * per_row;
  uint4 v[kStageUnits];
#pragma unroll
  for (int j = 0; j < kStageUnits; ++j) {
    const int u = threadIdx.x + j * kThreads, r = u / per_row, k = k0 + (u % per_row) * 8;
    v[j] = make_uint4(0, 0, 0, 0);
    if (u < units && r < nv && k < K) v[j] = __ldg(reinterpret_cast<const uint4*>(x + (x0 + r) * ldx + k));
  }
#pragma unroll
  for (int j = 0; j < kStageUnits; ++j) {
    const int u = threadIdx.x + j * kThreads, r = u / per_row, kk = (u % per_row) * 8;
    if (u >= units) break;
    float* dst = sx + r * kt + tile_index<8>(kk);
    *reinterpret_cast<float4*>(dst) = make_float4(__uint_as_float(v[j].x << 16), __uint_as_float(v[j].x & 0xFFFF0000u),
                                                  __uint_as_float(v[j].y << 16), __uint_as_float(v[j].y & 0xFFFF0000u));
    *reinterpret_cast<float4*>(dst + 128) = make_float4(__uint_as_float(v[j].z << 16), __uint_as_float(v[j].z & 0xFFFF0000u),
                                                        __uint_as_float(v[j].w << 16), __uint_as_float(v[j].w & 0xFFFF0000u));
  }
}

// First step of [s0, s1) that belongs to split warp kw of ks (steps s with s % ks == kw).
__device__ __forceinline__ int first_step(int s0, int kw, int ks) { return s0 + ((kw - s0 % ks) % ks + ks) % ks; }

// Folds the R lane partials of every warp into warp kw == 0 of its group: butterfly, then the ks
// warps' sums in warp order through `red` ([kWarps][R] floats). Every thread of the CTA calls it.
template <int R>
__device__ __forceinline__ void fold_split(float (&acc)[R], float* red, int ks) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, kw = warp % ks;
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
  if (ks == 1) return;
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r) red[warp * R + r] = acc[r];
  __syncthreads();
  if (kw == 0)
    for (int j = 1; j < ks; ++j)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] = __fadd_rn(acc[r], red[(warp + j) * R + r]);
  __syncthreads();  // `red` is free again for the next pass
}

// The pipeline every kernel runs for one output pass: tiles of the K steps in order; in each, the
// warp's steps (s % ks == kw) in groups of U, each group's weight loads issued one group ahead
// (double buffer: up to 2U 16-byte loads per lane in flight), the first group's before the tile is
// staged (weights do not depend on it). load(buf, s, s1) loads the group at s into buffer buf (0 or
// 1); use(buf, s, s0, s1) consumes it; stage(t) fills the tile (all threads, between barriers).
// Order of a lane's steps: increasing s, whatever the tile length or U.
template <int U, typename Load, typename Use, typename Stage>
__device__ __forceinline__ void run_pass(int steps, int tsteps, int ks, bool stage_now, Load load, Use use, Stage stage) {
  const int kw = (threadIdx.x / 32) % ks, stride = ks * U;
  const int ntiles = (steps + tsteps - 1) / tsteps;
  for (int t = 0; t < ntiles; ++t) {
    const int s0 = t * tsteps, s1 = s0 + tsteps < steps ? s0 + tsteps : steps;
    int s = first_step(s0, kw, ks);
    load(0, s, s1);
    if (ntiles > 1 || stage_now) {
      __syncthreads();
      stage(s0);
      __syncthreads();
    }
    while (s < s1) {
      load(1, s + stride, s1);
      use(0, s, s0, s1);
      s += stride;
      if (s >= s1) break;
      load(0, s + stride, s1);
      use(1, s, s0, s1);
      s += stride;
    }
  }
}

// Columns per warp group: every x value read from shared memory serves this many weight rows
// (the f32 tile costs 4 bytes of LDS per element and row; one column per warp would make shared
// memory, not HBM, the limit). Loads per group: kUnroll / columns steps of each column.
constexpr int kFp8Cols = 2, kFp4Cols = 4, kBf16Cols = 2;

__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// ---- FP8 e4m3 weights x act_quant rows --------------------------------------------------------
// E = 16: lane L's piece of step s is half (L & 1) of the 32-block 16s + L/2; its partial is
// scaled by that block's weight scale (the activation scale is in the staged f32). The group's
// C columns n0 .. n0 + C - 1 (n0 % C == 0, so one 32-row scale block) share the x reads.
// One weight of a launch: [N, K] codes W, scales S, output y [M, N], its split-K factor (from its
// shape only) and output passes. A launch covers one weight, or two over the same activation rows
// (fast_fp8_gemv2_q): passes [0, a.passes) are a's, the rest b's, each computed as alone.
struct Fp8Part {
  const uint8_t* W = nullptr;
  const uint8_t* S = nullptr;
  int64_t N = 0;
  int ks = 1;
  int64_t passes = 0;
  uint16_t* y = nullptr;
};

template <int R, int MinB>
__global__ void __launch_bounds__(kThreads, MinB) fast_fp8_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t M,
                                                            Fp8Part pa, Fp8Part pb, int K, int kt) {
  constexpr int E = 16, SW = 32 * E, C = kFp8Cols, U = kUnroll / C;
  pdl_trigger();  // PDL (pdl.cuh): weights are read before pdl_wait(), the activations after
  extern __shared__ float4 smem_f4[];
  float* sx = reinterpret_cast<float*>(smem_f4);
  float* red = sx + R * kt;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int KB = K / 32, steps = (K + SW - 1) / SW, tsteps = kt / SW;
  const int64_t m0 = int64_t(blockIdx.y) * R, all_passes = pa.passes + pb.passes;
  const int nv = int(M - m0 < R ? M - m0 : R);
  for (int64_t gpass = blockIdx.x; gpass < all_passes; gpass += gridDim.x) {
    const bool second = gpass >= pa.passes;
    const Fp8Part& P = second ? pb : pa;
    const int64_t pass = second ? gpass - pa.passes : gpass, N = P.N;
    const int ks = P.ks, kw = warp % ks, per_pass = kWarps / ks * C;
    const uint8_t* __restrict__ W = P.W;
    const uint8_t* __restrict__ S = P.S;
    uint16_t* __restrict__ y = P.y;
    const int64_t n0 = pass * per_pass + (warp / ks) * C;
    const uint8_t* wr[C];
#pragma unroll
    for (int c = 0; c < C; ++c) wr[c] = W + (n0 + c < N ? n0 + c : N - 1) * K;  // past the end: recompute, store nothing
    const uint8_t* sr = S + ((n0 < N ? n0 : N - 1) / 32) * KB;
    float acc[C * R];  // [c * R + r]
#pragma unroll
    for (int i = 0; i < C * R; ++i) acc[i] = 0.0f;
    uint4 wv[2][U][C];
    uint32_t sc[2][U];
    auto load = [&](int buf, int s, int s1) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int su = s + u * ks, k = su * SW + lane * E;
        const bool on = su < s1 && k < K;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          wv[buf][u][c] = on ? __ldg(reinterpret_cast<const uint4*>(wr[c] + k)) : make_uint4(0, 0, 0, 0);
          // the group after this one into L2: more bytes in flight than the registers hold
          if (su + ks * U < s1 && k + ks * U * SW < K) prefetch_l2(wr[c] + k + ks * U * SW);
        }
        sc[buf][u] = on ? __ldg(sr + k / 32) : 0u;
      }
    };
    auto use = [&](int buf, int s, int s0, int s1) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int su = s + u * ks, k = su * SW + lane * E;
        if (su >= s1 || k >= K) continue;
        float wf[C][16];
#pragma unroll
        for (int c = 0; c < C; ++c) {
          e4m3x4_f32(wv[buf][u][c].x, wf[c]);
          e4m3x4_f32(wv[buf][u][c].y, wf[c] + 4);
          e4m3x4_f32(wv[buf][u][c].z, wf[c] + 8);
          e4m3x4_f32(wv[buf][u][c].w, wf[c] + 12);
        }
        const float ws = e8m0_f32(sc[buf][u]);
        const float* xp = sx + (su - s0) * SW + lane * 4;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float h[C];
#pragma unroll
          for (int c = 0; c < C; ++c) h[c] = 0.0f;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float4 xv = *reinterpret_cast<const float4*>(xp + r * kt + i * 128);
#pragma unroll
            for (int c = 0; c < C; ++c) {
              h[c] = __fmaf_rn(xv.x, wf[c][4 * i + 0], h[c]);
              h[c] = __fmaf_rn(xv.y, wf[c][4 * i + 1], h[c]);
              h[c] = __fmaf_rn(xv.z, wf[c][4 * i + 2], h[c]);
              h[c] = __fmaf_rn(xv.w, wf[c][4 * i + 3], h[c]);
            }
          }
#pragma unroll
          for (int c = 0; c < C; ++c) acc[c * R + r] = __fmaf_rn(h[c], ws, acc[c * R + r]);
        }
      }
    };
    auto stage = [&](int s0) {
      pdl_wait();  // the first stage of a CTA comes before any store
      stage_quant<R, E>(sx, xc, xs, m0, nv, K, s0 * SW, kt);
    };
    run_pass<U>(steps, tsteps, ks, gpass == blockIdx.x, load, use, stage);  // the staged rows serve both weights
    fold_split<C * R>(acc, red, ks);
    if (kw == 0 && lane == 0)
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int r = 0; r < R; ++r)
          if (r < nv && n0 + c < N) y[(m0 + r) * N + n0 + c] = to_bf(acc[c * R + r]);
  }
}

// ---- MXFP4 expert weights x act_quant rows ------------------------------------------------------
// One row per CTA row (blockIdx.y = m): rows of a decode step use different experts, so there is
// no weight to share between them. E = 32: lane L's piece of step s is the whole 32-block 32s + L
// (16 bytes of packed e2m1); the block partial is taken with the weights scaled by 2^-14 (exact,
// e2m1x8_f32_scaled), multiplied back by 2^14 (exact) and scaled by the block's e8m0 scale.
// A warp group computes kFp4Cols weight rows: columns n0 .. n0 + 3 of W, or with TWO columns
// n0, n0 + 1 of Wa and of Wb (into ya, yb), all sharing the staged x reads. A column's arithmetic
// is the same in either mode (fast_fp4_gemv2_q's outputs are fast_fp4_gemv_q's bit for bit).
template <bool TWO, int MinB>
__global__ void __launch_bounds__(kThreads, MinB) fast_fp4_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t x_div,
                                                            const uint8_t* __restrict__ Wa, const uint8_t* __restrict__ Sa,
                                                            const uint8_t* __restrict__ Wb, const uint8_t* __restrict__ Sb, int64_t N, int K,
                                                            int64_t w_stride, int64_t s_stride, const int32_t* __restrict__ expert, int ks, int kt,
                                                            uint16_t* __restrict__ ya, uint16_t* __restrict__ yb) {
  constexpr int E = 32, SW = 32 * E, NO = kFp4Cols, COLS = TWO ? NO / 2 : NO, U = 1;
  pdl_trigger();
  pdl_wait();  // the expert ids (which weights to read) come from the step
  extern __shared__ float4 smem_f4[];
  float* sx = reinterpret_cast<float*>(smem_f4);
  float* red = sx + kt;
  const int64_t m = blockIdx.y;
  const int64_t e = expert ? expert[m] : 0;
  if (e < 0) return;  // the whole CTA: a skipped row, y untouched
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, kw = warp % ks, per_pass = kWarps / ks * COLS;
  const int KB = K / 32, steps = (K + SW - 1) / SW, tsteps = kt / SW;
  const int64_t passes = (N + per_pass - 1) / per_pass;
  for (int64_t pass = blockIdx.x; pass < passes; pass += gridDim.x) {
    const int64_t n0 = pass * per_pass + (warp / ks) * COLS;
    // slot o: column n0 + o % COLS of weight o / COLS (a, or b with TWO)
    const uint8_t* wr[NO];
    const uint8_t* sr[NO];
#pragma unroll
    for (int o = 0; o < NO; ++o) {
      const int64_t n = n0 + o % COLS, nr = n < N ? n : N - 1;
      wr[o] = (o / COLS ? Wb : Wa) + e * w_stride + nr * (K / 2);
      sr[o] = (o / COLS ? Sb : Sa) + e * s_stride + nr * KB;
    }
    float acc[NO];
#pragma unroll
    for (int o = 0; o < NO; ++o) acc[o] = 0.0f;
    uint4 wv[2][U][NO];
    uint32_t sc[2][U][NO];
    auto load = [&](int buf, int s, int s1) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int su = s + u * ks, b = su * 32 + lane;
        const bool on = su < s1 && b < KB;
#pragma unroll
        for (int o = 0; o < NO; ++o) {
          wv[buf][u][o] = on ? __ldg(reinterpret_cast<const uint4*>(wr[o] + b * 16)) : make_uint4(0, 0, 0, 0);
          sc[buf][u][o] = on ? __ldg(sr[o] + b) : 0u;
          if (su + ks * U < s1 && b + ks * U * 32 < KB) prefetch_l2(wr[o] + (b + ks * U * 32) * 16);
        }
      }
    };
    auto use = [&](int buf, int s, int s0, int s1) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int su = s + u * ks, b = su * 32 + lane;
        if (su >= s1 || b >= KB) continue;
        const float* xp = sx + (su - s0) * SW + lane * 4;
        float h[NO];
#pragma unroll
        for (int o = 0; o < NO; ++o) h[o] = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; ++g) {  // packed word g = elements 8g .. 8g + 7
          const float4 x0 = *reinterpret_cast<const float4*>(xp + (2 * g) * 128);
          const float4 x1 = *reinterpret_cast<const float4*>(xp + (2 * g + 1) * 128);
          const float xv[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
          for (int o = 0; o < NO; ++o) {
            const uint4& q = wv[buf][u][o];
            const uint32_t word = g == 0 ? q.x : g == 1 ? q.y : g == 2 ? q.z : q.w;
            float wf[8];
            e2m1x8_f32_scaled(word, wf);
#pragma unroll
            for (int i = 0; i < 8; ++i) h[o] = __fmaf_rn(xv[i], wf[i], h[o]);
          }
        }
#pragma unroll
        for (int o = 0; o < NO; ++o) acc[o] = __fmaf_rn(__fmul_rn(h[o], 16384.0f), e8m0_f32(sc[buf][u][o]), acc[o]);
      }
    };
    auto stage = [&](int s0) { stage_quant<1, E>(sx, xc, xs, m / x_div, 1, K, s0 * SW, kt); };
    run_pass<U>(steps, tsteps, ks, pass == blockIdx.x, load, use, stage);
    fold_split<NO>(acc, red, ks);
    if (kw == 0 && lane == 0)
#pragma unroll
      for (int o = 0; o < NO; ++o) {
        const int64_t n = n0 + o % COLS;
        if (n < N) (o / COLS ? yb : ya)[m * N + n] = to_bf(acc[o]);
      }
  }
}

// ---- bf16 x bf16 (grouped) ----------------------------------------------------------------------
// E = 8: lane L's piece of step s is elements [256s + 8L, +8), fused into the row's accumulator in
// increasing k (no block scales). blockIdx.y = chunk * G + g. C columns per warp group.
template <int R, int MinB>
__global__ void __launch_bounds__(kThreads, MinB) fast_bf16_kernel(const uint16_t* __restrict__ x, int64_t M, int K, int64_t ldx,
                                                             const uint16_t* __restrict__ w, int64_t N, void* y, int64_t ldy, int mode, int64_t G,
                                                             int64_t gx, int64_t gw, int64_t gy, int ks, int kt) {
  constexpr int E = 8, SW = 32 * E, C = kBf16Cols, U = kUnroll / C;
  pdl_trigger();
  extern __shared__ float4 smem_f4[];
  float* sx = reinterpret_cast<float*>(smem_f4);
  float* red = sx + R * kt;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, kw = warp % ks, per_pass = kWarps / ks * C;
  const int64_t g = blockIdx.y % G, m0 = int64_t(blockIdx.y / G) * R;
  const int steps = (K + SW - 1) / SW, tsteps = kt / SW;
  const int64_t passes = (N + per_pass - 1) / per_pass;
  const int nv = int(M - m0 < R ? M - m0 : R);
  const uint16_t* xg = x + g * gx;
  const uint16_t* wg = w + g * gw;
  for (int64_t pass = blockIdx.x; pass < passes; pass += gridDim.x) {
    const int64_t n0 = pass * per_pass + (warp / ks) * C;
    const uint16_t* wr[C];
#pragma unroll
    for (int c = 0; c < C; ++c) wr[c] = wg + (n0 + c < N ? n0 + c : N - 1) * K;
    float acc[C * R];
#pragma unroll
    for (int i = 0; i < C * R; ++i) acc[i] = 0.0f;
    uint4 wv[2][U][C];
    auto load = [&](int buf, int s, int s1) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int su = s + u * ks, k = su * SW + lane * E;
        const bool on = su < s1 && k < K;
#pragma unroll
        for (int c = 0; c < C; ++c) {
          wv[buf][u][c] = on ? __ldg(reinterpret_cast<const uint4*>(wr[c] + k)) : make_uint4(0, 0, 0, 0);
          if (su + ks * U < s1 && k + ks * U * SW < K) prefetch_l2(wr[c] + k + ks * U * SW);
        }
      }
    };
    auto use = [&](int buf, int s, int s0, int s1) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int su = s + u * ks, k = su * SW + lane * E;
        if (su >= s1 || k >= K) continue;
        float wf[C][8];
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const uint32_t ww[4] = {wv[buf][u][c].x, wv[buf][u][c].y, wv[buf][u][c].z, wv[buf][u][c].w};
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            wf[c][2 * i] = __uint_as_float(ww[i] << 16);
            wf[c][2 * i + 1] = __uint_as_float(ww[i] & 0xFFFF0000u);
          }
        }
        const float* xp = sx + (su - s0) * SW + lane * 4;
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const float4 xv = *reinterpret_cast<const float4*>(xp + r * kt + i * 128);
#pragma unroll
            for (int c = 0; c < C; ++c) {
              float& a = acc[c * R + r];
              a = __fmaf_rn(xv.x, wf[c][4 * i + 0], a);
              a = __fmaf_rn(xv.y, wf[c][4 * i + 1], a);
              a = __fmaf_rn(xv.z, wf[c][4 * i + 2], a);
              a = __fmaf_rn(xv.w, wf[c][4 * i + 3], a);
            }
          }
        }
      }
    };
    auto stage = [&](int s0) {
      pdl_wait();  // the first stage of a CTA comes before any store (and mode 2's read of y)
      stage_bf16<R>(sx, xg, ldx, m0, nv, K, s0 * SW, kt);
    };
    run_pass<U>(steps, tsteps, ks, pass == blockIdx.x, load, use, stage);
    fold_split<C * R>(acc, red, ks);
    if (kw == 0 && lane == 0)
#pragma unroll
      for (int c = 0; c < C; ++c)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int64_t n = n0 + c;
          if (r >= nv || n >= N) continue;
          const int64_t at = g * gy + (m0 + r) * ldy + n;
          if (mode == 0) static_cast<uint16_t*>(y)[at] = to_bf(acc[c * R + r]);
          else if (mode == 1) static_cast<float*>(y)[at] = acc[c * R + r];
          else static_cast<float*>(y)[at] = __fadd_rn(static_cast<float*>(y)[at], acc[c * R + r]);
        }
  }
}

// ---- host side --------------------------------------------------------------------------------

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Rows per chunk: the weights are read once per chunk, so as many rows as the registers allow (8);
// fewer rows get a kernel of exactly that many (no idle row slots).
int rows_per_chunk(int64_t M) { return M < 8 ? int(M) : 8; }

// Calls f(std::integral_constant<int, R>) for R = rows_per_chunk(M).
template <typename F>
Status with_rows(int64_t M, F f) {
  switch (rows_per_chunk(M)) {
    case 1: return f(std::integral_constant<int, 1>());
    case 2: return f(std::integral_constant<int, 2>());
    case 3: return f(std::integral_constant<int, 3>());
    case 4: return f(std::integral_constant<int, 4>());
    case 5: return f(std::integral_constant<int, 5>());
    case 6: return f(std::integral_constant<int, 6>());
    case 7: return f(std::integral_constant<int, 7>());
    default: return f(std::integral_constant<int, 8>());
  }
}

// Split-K factor from the weight shape alone (never from M: row invariance): double while too few
// warps would stream the weight and every split warp keeps >= 2 steps.
int split_k(int64_t outputs, int64_t steps) {
  int ks = 1;
  while (ks < kWarps && outputs * ks < kWantWarps && steps >= 4 * ks) ks *= 2;
  return ks;
}

// Tile length (elements, a multiple of the step) for R staged rows.
int tile_elems(int R, int64_t steps, int step_elems) {
  int64_t t = kTileBytes / (4 * int64_t(R) * step_elems);
  if (t < 1) t = 1;
  if (t > steps) t = steps;
  return int(t * step_elems);
}

// Persistent grid: about as many CTAs in all (x times the `rows` CTA rows of the launch) as can
// be resident (occupancy cached per kernel, shared memory size and device; one host query per new
// triple), at most one per output pass.
Status grid_for(const void* kernel, size_t smem, int64_t passes, int64_t rows, unsigned* grid) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, size_t, int>, int64_t> cache;  // -> resident CTAs on the device
  int dev_id = 0;
  FB_CUDA_TRY(cudaGetDevice(&dev_id));
  const auto key = std::make_tuple(kernel, smem, dev_id);
  int64_t resident = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(key);
    if (it != cache.end()) resident = it->second;
  }
  if (resident == 0) {
    int sms = 0, per_sm = 0;
    FB_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev_id));
    FB_RETURN_IF_ERROR(allow_dynamic_smem(kernel, smem));
    FB_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
    resident = int64_t(sms) * (per_sm > 0 ? per_sm : 1);
    std::lock_guard<std::mutex> lock(mu);
    cache[key] = resident;
  }
  int64_t x = (resident + rows - 1) / rows;
  if (x > passes) x = passes;
  *grid = unsigned(x > 0 ? x : 1);
  return Status();
}

template <int R>
Status launch_fp8(const QuantBuf& q, int64_t M, const Fp8W& wa, uint16_t* ya, const Fp8W* wb, uint16_t* yb, cudaStream_t st) {
  constexpr int SW = 512;
  const int64_t steps = (wa.K + SW - 1) / SW;
  const int kt = tile_elems(R, steps, SW);
  auto part = [&](const Fp8W& w, uint16_t* y) {
    Fp8Part p;
    p.W = w.w;
    p.S = w.s;
    p.N = w.N;
    p.ks = split_k((w.N + kFp8Cols - 1) / kFp8Cols, steps);
    const int64_t per_pass = kWarps / p.ks * kFp8Cols;
    p.passes = (w.N + per_pass - 1) / per_pass;
    p.y = y;
    return p;
  };
  const Fp8Part pa = part(wa, ya), pb = wb ? part(*wb, yb) : Fp8Part();
  const size_t smem = size_t(R) * kt * 4 + size_t(kWarps) * kFp8Cols * R * 4;
  const bool occ = g_fast_occupancy.load(std::memory_order_relaxed);
  const void* kernel = occ ? reinterpret_cast<const void*>(&fast_fp8_kernel<R, kOccBlocks>) : reinterpret_cast<const void*>(&fast_fp8_kernel<R, 1>);
  unsigned gx = 0;
  const int64_t chunks = (M + R - 1) / R;
  FB_CHECK(chunks <= 65535) << "fast fp8 gemv M=" << M;
  FB_RETURN_IF_ERROR(grid_for(kernel, smem, pa.passes + pb.passes, chunks, &gx));
  const dim3 grid(gx, unsigned(chunks));
  return launch_op_pdl("fast_fp8_kernel", fast_pdl(), occ ? fast_fp8_kernel<R, kOccBlocks> : fast_fp8_kernel<R, 1>, grid, dim3(kThreads), smem, st,
                       q.codes, q.scales, M, pa, pb, int(wa.K), kt);
}

template <bool TWO>
Status launch_fp4(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, const Fp4W& wb, const int32_t* expert, uint16_t* ya,
                  uint16_t* yb, cudaStream_t st) {
  constexpr int SW = 1024;
  const int64_t steps = (wa.K + SW - 1) / SW;
  // the split depends on N, K only (not on TWO: a column's sum is the same in both kernels)
  const int ks = split_k((wa.N + kFp4Cols - 1) / kFp4Cols, steps), kt = tile_elems(1, steps, SW);
  const int64_t per_pass = kWarps / ks * (TWO ? kFp4Cols / 2 : kFp4Cols);
  const size_t smem = size_t(kt) * 4 + size_t(kWarps) * kFp4Cols * 4;
  const bool occ = g_fast_occupancy.load(std::memory_order_relaxed);
  const void* kernel = occ ? reinterpret_cast<const void*>(&fast_fp4_kernel<TWO, kOccBlocks>) : reinterpret_cast<const void*>(&fast_fp4_kernel<TWO, 1>);
  unsigned gx = 0;
  FB_CHECK(M <= 65535) << "fast fp4 gemv rows " << M;
  FB_RETURN_IF_ERROR(grid_for(kernel, smem, (wa.N + per_pass - 1) / per_pass, M, &gx));
  const dim3 grid(gx, unsigned(M));
  return launch_op_pdl("fast_fp4_kernel", fast_pdl(), occ ? fast_fp4_kernel<TWO, kOccBlocks> : fast_fp4_kernel<TWO, 1>, grid, dim3(kThreads), smem,
                       st, q.codes, q.scales, x_div, wa.w, wa.s, wb.w, wb.s, wa.N, int(wa.K), wa.w_stride, wa.s_stride, expert, ks, kt, ya, yb);
}

void check_fp4(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& w) {
  FB_CHECK(w.K % 32 == 0 && w.K < (int64_t(1) << 30) && x_div >= 1 && w.w && w.s) << "fast fp4 gemv K=" << w.K << " x_div=" << x_div;
  FB_CHECK(aligned16(w.w) && w.w_stride % 16 == 0 && aligned16(q.codes)) << "fast fp4 gemv: 16-byte weight rows and codes";
  FB_CHECK(((M - 1) / x_div + 1) * w.K <= q.capacity) << "fast fp4 gemv M=" << M << " capacity=" << q.capacity;
}

template <int R>
Status launch_bf16(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, void* y, int64_t ldy, GemmOut out,
                   int64_t G, int64_t gx, int64_t gw, int64_t gy, cudaStream_t st) {
  constexpr int SW = 256;
  const int64_t steps = (K + SW - 1) / SW;
  const int ks = split_k((N + kBf16Cols - 1) / kBf16Cols * G, steps), kt = tile_elems(R, steps, SW);
  const size_t smem = size_t(R) * kt * 4 + size_t(kWarps) * kBf16Cols * R * 4;
  const int64_t per_pass = kWarps / ks * kBf16Cols;
  const bool occ = g_fast_occupancy.load(std::memory_order_relaxed);
  const void* kernel = occ ? reinterpret_cast<const void*>(&fast_bf16_kernel<R, kOccBlocks>) : reinterpret_cast<const void*>(&fast_bf16_kernel<R, 1>);
  const int64_t gy_ctas = ((M + R - 1) / R) * G;
  FB_CHECK(gy_ctas <= 65535) << "fast bf16 gemv M=" << M << " G=" << G;
  unsigned gridx = 0;
  FB_RETURN_IF_ERROR(grid_for(kernel, smem, (N + per_pass - 1) / per_pass, gy_ctas, &gridx));
  const dim3 grid(gridx, unsigned(gy_ctas));
  return launch_op_pdl("fast_bf16_kernel", fast_pdl(), occ ? fast_bf16_kernel<R, kOccBlocks> : fast_bf16_kernel<R, 1>, grid, dim3(kThreads), smem, st,
                       x, M, int(K), ldx, w, N, y, ldy, int(out), G, gx, gw, gy, ks, kt);
}

}  // namespace

void set_fast_gemv_occupancy(bool on) { g_fast_occupancy.store(on, std::memory_order_relaxed); }
void set_fast_gemv_tc(bool on) { g_fast_tc.store(on, std::memory_order_relaxed); }
bool fast_gemv_tc() { return g_fast_tc.load(std::memory_order_relaxed); }

Status fast_fp8_gemv_q(const QuantBuf& q, int64_t M, const Fp8W& w, uint16_t* y, cudaStream_t st) {
  FB_CHECK(w.K % 32 == 0 && w.K < (int64_t(1) << 30) && w.w && w.s) << "fast fp8 gemv K=" << w.K;
  FB_CHECK(aligned16(w.w) && aligned16(q.codes)) << "fast fp8 gemv: 16-byte weight rows and codes";
  FB_CHECK(M * w.K <= q.capacity) << "fast fp8 gemv M=" << M << " capacity=" << q.capacity;
  if (M == 0 || w.N == 0) return Status();
  if (fast_gemv_rs() && M <= 64) {  // register-streamed (CudaRunOptions::rs_gemv): every decode / verify / draft row count alike
    const RsWeight* p = FB_TRY(rs_packed_fp8(w, st));
    if (p) return rs_fp8_gemv(q, M, *p, y, st, fast_pdl());
  }
  if (fast_gemv_tc()) return tc_fp8_gemv(q, M, w, y, nullptr, nullptr, st);
  return with_rows(M, [&](auto r) { return launch_fp8<decltype(r)::value>(q, M, w, y, nullptr, nullptr, st); });
}

Status fast_fp8_gemv2_q(const QuantBuf& q, int64_t M, const Fp8W& wa, uint16_t* ya, const Fp8W& wb, uint16_t* yb, cudaStream_t st) {
  FB_CHECK(wa.K == wb.K && wa.K % 32 == 0 && wa.K < (int64_t(1) << 30) && wa.w && wa.s && wb.w && wb.s) << "fast fp8 gemv2 K=" << wa.K << "/" << wb.K;
  FB_CHECK(aligned16(wa.w) && aligned16(wb.w) && aligned16(q.codes)) << "fast fp8 gemv2: 16-byte weight rows and codes";
  FB_CHECK(M * wa.K <= q.capacity) << "fast fp8 gemv2 M=" << M << " capacity=" << q.capacity;
  if (M == 0) return Status();
  if (wa.N == 0) return fast_fp8_gemv_q(q, M, wb, yb, st);
  if (wb.N == 0) return fast_fp8_gemv_q(q, M, wa, ya, st);
  if (fast_gemv_rs() && M <= 64) {
    const RsWeight* pa = FB_TRY(rs_packed_fp8(wa, st));
    const RsWeight* pb = FB_TRY(rs_packed_fp8(wb, st));
    if (pa && pb) return rs_fp8_gemv2(q, M, *pa, ya, pb, yb, st, fast_pdl());
  }
  if (fast_gemv_tc()) return tc_fp8_gemv(q, M, wa, ya, &wb, yb, st);
  return with_rows(M, [&](auto r) { return launch_fp8<decltype(r)::value>(q, M, wa, ya, &wb, yb, st); });
}

Status fast_fp4_gemv_q(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& w, const int32_t* expert, uint16_t* y, cudaStream_t st,
                       bool group_rows, ExpertPdl pdl) {
  if (M == 0 || w.N == 0) return Status();
  check_fp4(q, M, x_div, w);
  if (fast_gemv_rs_fp4()) {  // registered (resident) experts only; grouped or not, the same bits per row
    const RsWeight* p = FB_TRY(rs_packed_fp4(w, st));
    if (p) return rs_fp4_gemv(q, M, x_div, *p, y, nullptr, nullptr, expert, st, fast_pdl(), group_rows);
  }
  if (fast_gemv_tc()) return tc_fp4_gemv(q, M, x_div, w, y, nullptr, nullptr, expert, st, group_rows, pdl);
  return launch_fp4<false>(q, M, x_div, w, w, expert, y, nullptr, st);
}

Status fast_fp4_gemv2_q(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, const Fp4W& wb, const int32_t* expert, uint16_t* ya,
                        uint16_t* yb, cudaStream_t st, bool group_rows, ExpertPdl pdl) {
  if (M == 0 || wa.N == 0) return Status();
  FB_CHECK(wa.N == wb.N && wa.K == wb.K && wa.w_stride == wb.w_stride && wa.s_stride == wb.s_stride) << "fast fp4 gemv2: shapes differ";
  check_fp4(q, M, x_div, wa);
  check_fp4(q, M, x_div, wb);
  if (fast_gemv_rs_fp4()) {
    const RsWeight* pa = FB_TRY(rs_packed_fp4(wa, st));
    const RsWeight* pb = FB_TRY(rs_packed_fp4(wb, st));
    if (pa && pb) return rs_fp4_gemv(q, M, x_div, *pa, ya, pb, yb, expert, st, fast_pdl(), group_rows);
  }
  if (fast_gemv_tc()) return tc_fp4_gemv(q, M, x_div, wa, ya, &wb, yb, expert, st, group_rows, pdl);
  return launch_fp4<true>(q, M, x_div, wa, wb, expert, ya, yb, st);
}

Status fast_bf16_gemv(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, void* y, int64_t ldy, GemmOut out,
                      int64_t G, int64_t gx, int64_t gw, int64_t gy, cudaStream_t st) {
  if (M == 0 || N == 0 || G == 0) return Status();
  FB_CHECK(K > 0 && K % 8 == 0 && K < (int64_t(1) << 30) && ldx % 8 == 0 && gx % 8 == 0 && gw % 8 == 0 && aligned16(x) && aligned16(w))
      << "fast bf16 gemv K=" << K << " ldx=" << ldx << " gx=" << gx << " gw=" << gw;
  return with_rows(M, [&](auto r) { return launch_bf16<decltype(r)::value>(x, M, K, ldx, w, N, y, ldy, out, G, gx, gw, gy, st); });
}

}  // namespace fb::cuda
