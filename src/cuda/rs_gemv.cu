// The register-streamed decode GEMVs of rs_gemv.h (layout: rs_layout.h).
//
//  CTA = W warps (rs_warps) on one stripe of 16 output rows: FP8, for a group of up to 8 activation
//  rows (the mma's 8 columns, blockIdx.y); MXFP4, for one expert row (column 0, blockIdx.y = m).
//  1. Shared memory gets the CTA's activation rows as f16 pairs in the order the B fragments read
//     them ([row][step][t][mma q][2 registers]: a lane's 8 registers of a step are 32 contiguous
//     bytes; staged 16 codes a load) and their scales (MXFP4: times 2^14, the decode's 2^-14
//     undone).
//  2. Warp w streams steps [w * per, (w + 1) * per) of the stripe: D steps of weight loads in
//     flight in registers (FP8: the first D issued before griddepcontrol.wait, the weights never
//     depend on the step), per step four mma.m16n8k16 (f16 in, f32 out), two per 32-block, each
//     block's sum from zero, then acc += sum * (weight scale * activation scale) (FMA).
//  3. The warps' accumulators add in warp order in shared memory; one RNE rounding to bf16.
#include "cuda/rs_gemv.h"

#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>

#include "base/check.h"
#include "cuda/numerics.cuh"
#include "cuda/pdl.cuh"
#include "cuda/rs_layout.h"

namespace fb::cuda {

using dev::to_bf;

namespace {

constexpr int kMaxWarps = 16;
constexpr int kPadUnits = 8;  // zero units past a packed buffer's end (room for a load-ahead that runs past it)
constexpr int kFp8Cols = 8;  // activation rows per FP8 CTA, expert rows per grouped MXFP4 CTA (the mma's n)
constexpr int64_t kMaxGroupRows = 64;
constexpr int kGroupCtasDefault = 8;  // CTAs per stripe of a grouped MXFP4 launch (each takes every Y-th group; tokens staged: Y / 2)  // MXFP4 rows grouped by expert: one warp's two ballots

std::atomic<int> g_fp8_target{0}, g_fp4_target{0}, g_depth{0}, g_group_rows{4}, g_group_ctas{kGroupCtasDefault};
std::atomic<bool> g_tok_stage{true};
constexpr int kFp8TargetDefault = 4096, kFp4TargetDefault = 768, kDepthDefault = 2;

__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two e4m3 codes as f16x2, exactly (every e4m3 value is an f16): the high two codes of a word, or
// the low two (low byte first; the 16-bit halves of a register feed the cvt directly).
__device__ __forceinline__ uint32_t e4m3x2_f16x2_hi(uint32_t four) {
  uint32_t r;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, hi;\n}" : "=r"(r) : "r"(four));
  return r;
}
__device__ __forceinline__ uint32_t e4m3x2_f16x2_lo(uint32_t four) {
  uint32_t r;
  asm("{\n .reg .b16 lo, hi;\n mov.b32 {lo, hi}, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}" : "=r"(r) : "r"(four));
  return r;
}

// An e8m0 scale byte (in bits 23..30 of `bits`, the rest zero) as f32 for bytes 1..254.
__device__ __forceinline__ float e8m0_bits(uint32_t bits) { return __uint_as_float(bits); }

// Stages `rows` activation rows (row r's K e4m3 codes at row_of(r), 16-byte aligned) as f16 pairs in
// B-fragment order, row r at bs + r * steps * 32: word ((j * 4 + t) * 4 + q) * 2 + h holds k =
// 64 j + 16 q + 8 h + 2 t and k + 1. A piece is 16 codes (one 16-byte load, eight stores); every
// row's pieces in one loop, several loads in flight per thread.
template <typename RowOf>
__device__ __forceinline__ void stage_rows(RowOf row_of, int rows, int steps, uint32_t* bs, int tid, int nthreads) {
  const int per_row = steps * 4, n = rows * per_row;
#pragma unroll 4
  for (int p = tid; p < n; p += nthreads) {
    const int r = p / per_row, pr = p - r * per_row, j = pr >> 2, q = pr & 3;
    const uint4 v = reinterpret_cast<const uint4*>(row_of(r))[pr];  // k = 64 j + 16 q + 0..15
    uint32_t* o = bs + r * steps * 32 + j * 32 + q * 2;              // + 8 t + h
    o[0] = e4m3x2_f16x2_lo(v.x);   // h 0, t 0
    o[8] = e4m3x2_f16x2_hi(v.x);   // h 0, t 1
    o[16] = e4m3x2_f16x2_lo(v.y);  // h 0, t 2
    o[24] = e4m3x2_f16x2_hi(v.y);  // h 0, t 3
    o[1] = e4m3x2_f16x2_lo(v.z);   // h 1, t 0
    o[9] = e4m3x2_f16x2_hi(v.z);   // h 1, t 1
    o[17] = e4m3x2_f16x2_lo(v.w);  // h 1, t 2
    o[25] = e4m3x2_f16x2_hi(v.w);  // h 1, t 3
  }
}

// ---- MXFP4 ------------------------------------------------------------------------------------

struct RsFp4Part {
  const uint4* w = nullptr;      // units of 32 x 16 bytes
  const uint32_t* s = nullptr;   // units of 8 words
  const uint8_t* special = nullptr;
  uint16_t* y = nullptr;
  int64_t N = 0;
  int stripes = 0;
};

// The step's four m16n8k16 products: a 32-byte unit of FP4 weights (rows g and g + 8, two
// 32-blocks) against the staged activations of lane (0, t) (zeros on other lanes' B), into
// d0 (block 0) and d1 (block 1), zeroed by the caller.
__device__ __forceinline__ void fp4_unit_mma(const uint4& wv, const uint4* bp, bool b_lane, float (&d0)[4], float (&d1)[4]) {
  uint4 bl = make_uint4(0, 0, 0, 0), bh = bl;
  if (b_lane) {
    bl = bp[0];
    bh = bp[1];
  }
  mma16816(d0, rs::fp4_pair_f16x2(wv.x, 0), rs::fp4_pair_f16x2(wv.x, 1), rs::fp4_pair_f16x2(wv.x, 2), rs::fp4_pair_f16x2(wv.x, 3), bl.x, bl.y);
  mma16816(d0, rs::fp4_pair_f16x2(wv.y, 0), rs::fp4_pair_f16x2(wv.y, 1), rs::fp4_pair_f16x2(wv.y, 2), rs::fp4_pair_f16x2(wv.y, 3), bl.z, bl.w);
  mma16816(d1, rs::fp4_pair_f16x2(wv.z, 0), rs::fp4_pair_f16x2(wv.z, 1), rs::fp4_pair_f16x2(wv.z, 2), rs::fp4_pair_f16x2(wv.z, 3), bh.x, bh.y);
  mma16816(d1, rs::fp4_pair_f16x2(wv.w, 0), rs::fp4_pair_f16x2(wv.w, 1), rs::fp4_pair_f16x2(wv.w, 2), rs::fp4_pair_f16x2(wv.w, 3), bh.z, bh.w);
}

// The scale word's four E8M0 bytes as floats: (row g, block 0), (g, 1), (g + 8, 0), (g + 8, 1).
template <bool kSlow>
__device__ __forceinline__ void fp4_unit_scales(uint32_t sw, float& w00, float& w01, float& w10, float& w11) {
  if (kSlow) {
    w00 = dev::e8m0_val(uint8_t(sw));
    w01 = dev::e8m0_val(uint8_t(sw >> 8));
    w10 = dev::e8m0_val(uint8_t(sw >> 16));
    w11 = dev::e8m0_val(uint8_t(sw >> 24));
  } else {
    w00 = e8m0_bits((sw << 23) & 0x7F800000u);
    w01 = e8m0_bits((sw << 15) & 0x7F800000u);
    w10 = e8m0_bits((sw << 7) & 0x7F800000u);
    w11 = e8m0_bits((sw >> 1) & 0x7F800000u);
  }
}

// A warp's n steps of weight units (wp, + 32 a step) and scale words (sp, + 8 a step), loads
// running D steps ahead: the full groups of D steps run without a range test on the step, the
// last group with; step(unit, scale word, k) consumes step k in order.
template <int D, class Step>
__device__ __forceinline__ void fp4_pipeline(const uint4* __restrict__ wp, const uint32_t* __restrict__ sp, int n, Step&& step) {
  uint4 buf[D];
  uint32_t sbuf[D];
#pragma unroll
  for (int u = 0; u < D; ++u)
    if (u < n) {
      buf[u] = __ldg(wp + u * 32);
      sbuf[u] = __ldg(sp + u * 8);
    }
  int i = 0;
  for (; i + D <= n; i += D) {
#pragma unroll
    for (int u = 0; u < D; ++u) {
      const uint4 wv = buf[u];
      const uint32_t sw = sbuf[u];
      if (i + u + D < n) {  // (a load past the warp's last step would be another warp's bytes read twice)
        buf[u] = __ldg(wp + (i + u + D) * 32);
        sbuf[u] = __ldg(sp + (i + u + D) * 8);
      }
      step(wv, sw, i + u);
    }
  }
#pragma unroll
  for (int u = 0; u < D; ++u)
    if (i + u < n) step(buf[u], sbuf[u], i + u);
}

// A warp's four accumulators (rows g and g + 8, columns 2t and 2t + 1) into its fold slot
// fold[(warp * 16 + row) * 8 + col]; fold_warps sums output o over W warps in warp order.
__device__ __forceinline__ void put_fold(float* fold, int warp, int g, int t, const float (&tot)[4]) {
  float* f = fold + warp * 128;
  f[g * 8 + 2 * t] = tot[0];
  f[g * 8 + 2 * t + 1] = tot[1];
  f[(g + 8) * 8 + 2 * t] = tot[2];
  f[(g + 8) * 8 + 2 * t + 1] = tot[3];
}

__device__ __forceinline__ float fold_warps(const float* fold, int o, int W) {
  float v = 0.0f;
  for (int w = 0; w < W; ++w) v = __fadd_rn(v, fold[w * 128 + o]);
  return v;
}

// One step of a warp, accumulating rows g and g + 8 (column 0 of lanes t == 0 is the row's
// value; other lanes compute zeros).
template <bool kSlow>
__device__ __forceinline__ void fp4_step(const uint4& wv, uint32_t sw, const uint4* bp, float2 a, bool b_lane, float& tot0, float& tot1) {
  float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  fp4_unit_mma(wv, bp, b_lane, d0, d1);
  float w00, w01, w10, w11;
  fp4_unit_scales<kSlow>(sw, w00, w01, w10, w11);
  tot0 = __fmaf_rn(d0[0], __fmul_rn(w00, a.x), tot0);
  tot0 = __fmaf_rn(d1[0], __fmul_rn(w01, a.y), tot0);
  tot1 = __fmaf_rn(d0[2], __fmul_rn(w10, a.x), tot1);
  tot1 = __fmaf_rn(d1[2], __fmul_rn(w11, a.y), tot1);
}

// One warp's steps [j0, j1) of stripe unit base `u0` (in units).
template <int D, bool kSlow>
__device__ __forceinline__ void fp4_warp(const uint4* __restrict__ w, const uint32_t* __restrict__ s, int64_t u0, int j0, int j1, const uint32_t* bs,
                                         const float* as, int lane, float& tot0, float& tot1) {
  const int g = lane >> 2, t = lane & 3, n = j1 - j0;
  if (n <= 0) return;
  const uint4* wp = w + (u0 + j0) * 32 + lane;                              // + 32 a step
  const uint32_t* sp = s + (u0 + j0) * 8 + g;                               // + 8 a step
  const uint4* bp = reinterpret_cast<const uint4*>(bs + (j0 * 4 + t) * 8);  // + 8 a step (32 words)
  const float2* ap = reinterpret_cast<const float2*>(as) + j0;              // + 1 a step
  const bool b_lane = g == 0;
  fp4_pipeline<D>(wp, sp, n, [&](const uint4& wv, uint32_t sw, int k) { fp4_step<kSlow>(wv, sw, bp + k * 8, ap[k], b_lane, tot0, tot1); });
}

// Rows grouped by expert: up to 8 expert rows of one expert as the mma's columns (lane (g, t)
// holds columns 2t and 2t + 1 of rows g and g + 8). A column's arithmetic is fp4_step's on column
// 0, the same operations in the same order on its own B column and scales, so a row's bits do not
// depend on the grouping (test FastGemv.RsFp4MatchesExact's grouped cases). ac0 / ac1: the step's
// activation scales (two 32-blocks) of columns 2t and 2t + 1.
template <bool kSlow>
__device__ __forceinline__ void fp4_step_cols(const uint4& wv, uint32_t sw, const uint4* bp, const float* ac0, const float* ac1, bool b_lane,
                                              float (&tot)[4]) {
  float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  fp4_unit_mma(wv, bp, b_lane, d0, d1);
  float w00, w01, w10, w11;
  fp4_unit_scales<kSlow>(sw, w00, w01, w10, w11);
  const float a00 = ac0[0], a01 = ac0[1], a10 = ac1[0], a11 = ac1[1];  // (column 2t, block 0), (2t, 1), (2t + 1, 0), (2t + 1, 1)
  tot[0] = __fmaf_rn(d0[0], __fmul_rn(w00, a00), tot[0]);
  tot[0] = __fmaf_rn(d1[0], __fmul_rn(w01, a01), tot[0]);
  tot[1] = __fmaf_rn(d0[1], __fmul_rn(w00, a10), tot[1]);
  tot[1] = __fmaf_rn(d1[1], __fmul_rn(w01, a11), tot[1]);
  tot[2] = __fmaf_rn(d0[2], __fmul_rn(w10, a00), tot[2]);
  tot[2] = __fmaf_rn(d1[2], __fmul_rn(w11, a01), tot[2]);
  tot[3] = __fmaf_rn(d0[3], __fmul_rn(w10, a10), tot[3]);
  tot[3] = __fmaf_rn(d1[3], __fmul_rn(w11, a11), tot[3]);
}

// bcol: column g's staged row (B-fragment order); scol0 / scol1: the scales of columns 2t and 2t + 1.
template <int D, bool kSlow>
__device__ __forceinline__ void fp4_warp_cols(const uint4* __restrict__ w, const uint32_t* __restrict__ s, int64_t u0, int j0, int j1,
                                              const uint32_t* bcol, const float* scol0, const float* scol1, int cnt, int lane,
                                              float (&tot)[4]) {
  const int g = lane >> 2, t = lane & 3, n = j1 - j0;
  if (n <= 0) return;
  const uint4* wp = w + (u0 + j0) * 32 + lane;
  const uint32_t* sp = s + (u0 + j0) * 8 + g;
  const uint4* bp = reinterpret_cast<const uint4*>(bcol + (j0 * 4 + t) * 8);  // + 8 a step
  const float* ac0 = scol0 + 2 * j0;                                          // + 2 a step
  const float* ac1 = scol1 + 2 * j0;
  const bool b_lane = g < cnt;
  fp4_pipeline<D>(wp, sp, n,
                  [&](const uint4& wv, uint32_t sw, int k) { fp4_step_cols<kSlow>(wv, sw, bp + k * 8, ac0 + 2 * k, ac1 + 2 * k, b_lane, tot); });
}

// One group of rows (grp: count, expert, rows) of stripe `stripe`: its rows' activations (staged
// per group, or with ntok > 0 the tokens' rows staged once per CTA: column c reads token
// grp[2 + c] / x_div), the expert's stripe streamed, the warps folded, each row's 16 outputs stored.
template <int D>
__device__ __forceinline__ void group_body(const RsFp4Part& P, const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t x_div,
                                           int64_t K, int KB, int steps, int stripe, int tid, int lane, int warp, int W, const int* grp,
                                           int ntok, uint32_t* bs, float* as, float* fold) {
  const int cnt = grp[0], e = grp[1];
  const int g = lane >> 2, t = lane & 3;
  int sr_g, sr_0, sr_1;  // staged rows of columns g, 2t, 2t + 1
  if (ntok > 0) {
    const auto tok = [&](int c) { return c < cnt ? int(grp[2 + c] / x_div) : 0; };  // (columns past cnt: B is zero, the scale any finite one)
    sr_g = tok(g);
    sr_0 = tok(2 * t);
    sr_1 = tok(2 * t + 1);
  } else {
    stage_rows([&](int r) { return xc + int64_t(grp[2 + r] / x_div) * K; }, cnt, steps, bs, tid, int(blockDim.x));
    for (int b = tid; b < kFp8Cols * KB; b += int(blockDim.x)) {
      const int r = b / KB;
      as[b] = r < cnt ? __fmul_rn(xs[int64_t(grp[2 + r] / x_div) * KB + (b - r * KB)], 16384.0f) : 0.0f;
    }
    __syncthreads();
    sr_g = g;
    sr_0 = 2 * t;
    sr_1 = 2 * t + 1;
  }
  const int per = (steps + W - 1) / W, j0 = min(steps, warp * per), j1 = min(steps, j0 + per);
  const int64_t u0 = (int64_t(e) * P.stripes + stripe) * steps;
  float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const uint32_t* bcol = bs + sr_g * steps * 32;
  if (P.special[e]) fp4_warp_cols<D, true>(P.w, P.s, u0, j0, j1, bcol, as + sr_0 * KB, as + sr_1 * KB, cnt, lane, tot);
  else fp4_warp_cols<D, false>(P.w, P.s, u0, j0, j1, bcol, as + sr_0 * KB, as + sr_1 * KB, cnt, lane, tot);
  put_fold(fold, warp, g, t, tot);
  __syncthreads();
  for (int o = tid; o < 128; o += int(blockDim.x)) {
    const int row = o / 8, col = o % 8;
    if (col < cnt) P.y[int64_t(grp[2 + col]) * P.N + int64_t(stripe) * 16 + row] = to_bf(fold_warps(fold, o, W));
  }
}

// Rows grouped by expert (M <= 64, expert ids on the device): row m leads a group when the number
// of earlier rows with its expert is a multiple of G (gmax: 4 or 8, rs_set_group_rows) and takes
// that expert's next <= G rows from m on. The weights of an expert are read once per G of its rows;
// shared memory holds G staged rows. A CTA (stripe, y) computes groups y, y + Y, ... (Y = gridDim.y,
// rs_set_group_ctas) in leader order, so no CTA waits for a row that leads nothing. A row's bits
// depend on neither G nor Y.
template <int D>
__global__ void __launch_bounds__(kMaxWarps * 32) rs_fp4_grouped_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs,
                                                                         int64_t x_div, RsFp4Part pa, RsFp4Part pb,
                                                                         const int32_t* __restrict__ expert, int steps, int M, int cols,
                                                                         int gmax, int ntok) {
  extern __shared__ __align__(16) uint32_t smem[];
  __shared__ int grp[2 + 8];       // this group: count, expert, rows
  __shared__ int32_t ex_s[64];     // the rows' experts (-1 past M)
  __shared__ unsigned leaders[2];  // rows 0..31, 32..63 that lead a group
  const RsFp4Part P = blockIdx.z ? pb : pa;
  const int stripe = int(blockIdx.x);
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, W = int(blockDim.x) >> 5;
  const int KB = steps * 2;
  const int64_t K = int64_t(steps) * 64;
  pdl_wait();
  pdl_trigger();
  if (warp == 0) {  // every row's leadership: lane l holds rows l and l + 32
    const int p0 = lane, p1 = lane + 32;
    const int32_t e0 = p0 < M ? expert[p0] : -1, e1 = p1 < M ? expert[p1] : -1;
    ex_s[p0] = e0;
    ex_s[p1] = e1;
    int b0 = 0, b1 = 0;  // earlier rows with the same expert
    for (int q = 0; q < M; ++q) {
      const int32_t eq = __shfl_sync(~0u, q < 32 ? e0 : e1, q & 31);
      b0 += q < p0 && eq == e0;
      b1 += q < p1 && eq == e1;
    }
    const unsigned lo = __ballot_sync(~0u, e0 >= 0 && b0 % gmax == 0), hi = __ballot_sync(~0u, e1 >= 0 && b1 % gmax == 0);
    if (lane == 0) {
      leaders[0] = lo;
      leaders[1] = hi;
    }
  }
  __syncthreads();
  const unsigned lead_lo = leaders[0], lead_hi = leaders[1];
  const int n_lo = __popc(lead_lo), n_groups = n_lo + __popc(lead_hi);
  uint32_t* bs = smem;                                              // cols * steps * 32 words (ntok > 0: cols = ntok)
  float* as = reinterpret_cast<float*>(smem + cols * steps * 32);   // 8 * KB (zeros past cnt)
  float* fold = as + kFp8Cols * KB;                                 // W * 128
  if (ntok > 0 && int(blockIdx.y) < n_groups) {  // the tokens' rows, once for every group of this CTA
    stage_rows([&](int r) { return xc + int64_t(r) * K; }, ntok, steps, bs, tid, int(blockDim.x));
    for (int b = tid; b < ntok * KB; b += int(blockDim.x)) as[b] = __fmul_rn(xs[b], 16384.0f);  // tokens 0.. are contiguous
    __syncthreads();
  }
  for (int gi = int(blockIdx.y); gi < n_groups; gi += int(gridDim.y)) {
    if (warp == 0) {
      // the leader m: the gi-th set bit of the leader masks
      const unsigned msk = gi < n_lo ? lead_lo : lead_hi;
      const int nth = gi < n_lo ? gi : gi - n_lo;
      const bool hit = ((msk >> lane) & 1u) && __popc(msk & ((1u << lane) - 1u)) == nth;
      const int m = (__ffs(__ballot_sync(~0u, hit)) - 1) + (gi < n_lo ? 0 : 32);
      const int32_t es = ex_s[m];
      const int p0 = lane, p1 = lane + 32;
      const unsigned from_lo = __ballot_sync(~0u, p0 >= m && ex_s[p0] == es), from_hi = __ballot_sync(~0u, p1 >= m && ex_s[p1] == es);
      const unsigned below_lane = (1u << lane) - 1u;
      const int r0 = __popc(from_lo & below_lane), r1 = __popc(from_lo) + __popc(from_hi & below_lane);
      if (((from_lo >> lane) & 1u) && r0 < gmax) grp[2 + r0] = p0;
      if (((from_hi >> lane) & 1u) && r1 < gmax) grp[2 + r1] = p1;
      if (lane == 0) {
        grp[0] = min(gmax, __popc(from_lo) + __popc(from_hi));
        grp[1] = es;
      }
    }
    __syncthreads();
    group_body<D>(P, xc, xs, x_div, K, KB, steps, stripe, tid, lane, warp, W, grp, ntok, bs, as, fold);
    __syncthreads();  // the next group reuses grp and the shared buffers
  }
}

template <int D>
__global__ void __launch_bounds__(kMaxWarps * 32) rs_fp4_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t x_div,
                                                                 RsFp4Part pa, RsFp4Part pb, const int32_t* __restrict__ expert, int steps) {
  extern __shared__ __align__(16) uint32_t smem[];
  const RsFp4Part P = blockIdx.z ? pb : pa;
  const int stripe = int(blockIdx.x);
  const int64_t m = blockIdx.y;
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, W = int(blockDim.x) >> 5;
  const int KB = steps * 2;
  const int64_t K = int64_t(steps) * 64;
  pdl_wait();  // the expert ids and the activations are the step's
  // The next kernel may launch only now that this one has waited (what a following tile GEMV
  // that reads its expert ids before its own wait relies on: ops.h ExpertPdl).
  pdl_trigger();
  const int e = expert ? expert[m] : 0;
  if (e < 0) return;  // a skipped row: y untouched (uniform over the CTA)
  uint32_t* bs = smem;                                          // steps * 32 words
  float* as = reinterpret_cast<float*>(smem + steps * 32);      // KB
  float* fold = as + KB;                                        // W * 16
  const int64_t xm = m / x_div;
  stage_rows([&](int) { return xc + xm * K; }, 1, steps, bs, tid, int(blockDim.x));
  for (int b = tid; b < KB; b += int(blockDim.x)) as[b] = __fmul_rn(xs[xm * KB + b], 16384.0f);  // the decode's 2^-14
  __syncthreads();
  const int per = (steps + W - 1) / W, j0 = min(steps, warp * per), j1 = min(steps, j0 + per);
  const int64_t u0 = (int64_t(e) * P.stripes + stripe) * steps;
  float tot0 = 0.0f, tot1 = 0.0f;
  if (P.special[e]) fp4_warp<D, true>(P.w, P.s, u0, j0, j1, bs, as, lane, tot0, tot1);
  else fp4_warp<D, false>(P.w, P.s, u0, j0, j1, bs, as, lane, tot0, tot1);
  if ((lane & 3) == 0) {
    fold[warp * 16 + (lane >> 2)] = tot0;
    fold[warp * 16 + (lane >> 2) + 8] = tot1;
  }
  __syncthreads();
  if (tid < 16) {
    float v = 0.0f;
    for (int w = 0; w < W; ++w) v = __fadd_rn(v, fold[w * 16 + tid]);
    P.y[m * P.N + int64_t(stripe) * 16 + tid] = to_bf(v);
  }
}

// ---- FP8 --------------------------------------------------------------------------------------

struct RsFp8Args {
  const uint4* w = nullptr;     // units of 32 x 32 bytes
  const uint8_t* s = nullptr;   // e8m0 [ceil(N / 32), K / 32]
  uint16_t* y = nullptr;
  int64_t N = 0;
  int stripes = 0;
  int warps = 1;                // rs_warps(N, K): a launch of two weights runs each with its own
};

// One FP8 step of a lane: its 32 weight bytes (v0, v1: mmas 0-1 and 2-3), the B registers of its
// column when it has one, the stripe's two block scales (ws: 2 bytes) and the columns' activation
// scales (ac: column 2t's two blocks; column 2t + 1's at + KB).
__device__ __forceinline__ void fp8_step(const uint4& v0, const uint4& v1, const uint4* bp, bool b_lane, const uint8_t* ws, const float* ac,
                                         int KB, float (&tot)[4]) {
  uint4 bl = make_uint4(0, 0, 0, 0), bh = bl;
  if (b_lane) {
    bl = bp[0];
    bh = bp[1];
  }
  float d0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma16816(d0, e4m3x2_f16x2_lo(v0.x), e4m3x2_f16x2_hi(v0.x), e4m3x2_f16x2_lo(v0.y), e4m3x2_f16x2_hi(v0.y), bl.x, bl.y);
  mma16816(d0, e4m3x2_f16x2_lo(v0.z), e4m3x2_f16x2_hi(v0.z), e4m3x2_f16x2_lo(v0.w), e4m3x2_f16x2_hi(v0.w), bl.z, bl.w);
  mma16816(d1, e4m3x2_f16x2_lo(v1.x), e4m3x2_f16x2_hi(v1.x), e4m3x2_f16x2_lo(v1.y), e4m3x2_f16x2_hi(v1.y), bh.x, bh.y);
  mma16816(d1, e4m3x2_f16x2_lo(v1.z), e4m3x2_f16x2_hi(v1.z), e4m3x2_f16x2_lo(v1.w), e4m3x2_f16x2_hi(v1.w), bh.z, bh.w);
  const float ws0 = dev::e8m0_val(ws[0]), ws1 = dev::e8m0_val(ws[1]);
  const float s00 = __fmul_rn(ws0, ac[0]), s01 = __fmul_rn(ws1, ac[1]);
  const float s10 = __fmul_rn(ws0, ac[KB]), s11 = __fmul_rn(ws1, ac[KB + 1]);
  tot[0] = __fmaf_rn(d1[0], s01, __fmaf_rn(d0[0], s00, tot[0]));
  tot[1] = __fmaf_rn(d1[1], s11, __fmaf_rn(d0[1], s10, tot[1]));
  tot[2] = __fmaf_rn(d1[2], s01, __fmaf_rn(d0[2], s00, tot[2]));
  tot[3] = __fmaf_rn(d1[3], s11, __fmaf_rn(d0[3], s10, tot[3]));
}

template <int D>
__global__ void __launch_bounds__(kMaxWarps * 32) rs_fp8_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t M, int cols,
                                                                 int steps, RsFp8Args pa, RsFp8Args pb) {
  extern __shared__ __align__(16) uint32_t smem[];
  const RsFp8Args a = blockIdx.z ? pb : pa;
  const int stripe = int(blockIdx.x);
  if (stripe >= a.stripes) return;  // the other weight of the launch has more stripes (uniform over the CTA)
  const int64_t r0 = int64_t(blockIdx.y) * kFp8Cols;
  const int rows = M - r0 < cols ? int(M - r0) : cols;  // activation rows of this CTA (<= cols)
  const int tid = int(threadIdx.x), lane = tid & 31, warp = tid >> 5, W = a.warps;  // warps >= W only stage and fold
  const int g = lane >> 2, t = lane & 3;
  const int KB = steps * 2;
  const int64_t K = int64_t(steps) * 64;
  const int per = (steps + W - 1) / W, j0 = min(steps, warp * per), j1 = warp < W ? min(steps, j0 + per) : j0;
  const int64_t u0 = int64_t(stripe) * steps;
  // The first D steps' weights before the wait: no kernel of the step writes them.
  uint4 buf[D][2];
#pragma unroll
  for (int u = 0; u < D; ++u)
    if (j0 + u < j1) {
      buf[u][0] = __ldg(a.w + (u0 + j0 + u) * 64 + 2 * lane);
      buf[u][1] = __ldg(a.w + (u0 + j0 + u) * 64 + 2 * lane + 1);
    }
  pdl_wait();
  pdl_trigger();  // after the wait, as the MXFP4 kernel
  uint32_t* bs = smem;                                               // cols * steps * 32 words
  float* as = reinterpret_cast<float*>(smem + cols * steps * 32);    // 8 * KB: every mma column's (zeros past `rows`)
  float* fold = as + kFp8Cols * KB;                                  // W * 16 * 8
  stage_rows([&](int r) { return xc + (r0 + r) * K; }, rows, steps, bs, tid, int(blockDim.x));
  for (int b = tid; b < kFp8Cols * KB; b += int(blockDim.x)) as[b] = b < rows * KB ? xs[r0 * KB + b] : 0.0f;  // rows r0.. are contiguous
  __syncthreads();
  const int rb = (stripe * 16) / 32;  // the stripe's 32-row scale block
  float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // (row g, col 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1)
  const int n = j1 - j0;
  const uint4* wp = a.w + (u0 + j0) * 64 + 2 * lane;                                 // + 64 a step
  const uint4* bp = reinterpret_cast<const uint4*>(bs + ((g * steps + j0) * 4 + t) * 8);  // + 8 a step
  const uint8_t* sp = a.s + int64_t(rb) * KB + 2 * j0;                               // + 2 a step
  const float* ac = as + 2 * t * KB + 2 * j0;                                        // + 2 a step
  const bool b_lane = g < rows;
  int i = 0;
  for (; i + D <= n; i += D) {  // full groups: no range test on the step
#pragma unroll
    for (int u = 0; u < D; ++u) {
      const uint4 v0 = buf[u][0], v1 = buf[u][1];
      if (i + u + D < n) {
        buf[u][0] = __ldg(wp + (i + u + D) * 64);
        buf[u][1] = __ldg(wp + (i + u + D) * 64 + 1);
      }
      fp8_step(v0, v1, bp + (i + u) * 8, b_lane, sp + 2 * (i + u), ac + 2 * (i + u), KB, tot);
    }
  }
#pragma unroll
  for (int u = 0; u < D; ++u)
    if (i + u < n) fp8_step(buf[u][0], buf[u][1], bp + (i + u) * 8, b_lane, sp + 2 * (i + u), ac + 2 * (i + u), KB, tot);
  // fold[(warp * 16 + row) * 8 + col], warps < W
  if (warp < W) put_fold(fold, warp, g, t, tot);
  __syncthreads();
  // 128 outputs (16 rows x 8 columns): a CTA of one or two warps folds several each
  for (int o = tid; o < 128; o += int(blockDim.x)) {
    const int row = o / 8, col = o % 8;
    if (col < rows) a.y[(r0 + col) * a.N + int64_t(stripe) * 16 + row] = to_bf(fold_warps(fold, o, W));
  }
}

// ---- packing ----------------------------------------------------------------------------------

__global__ void rs_pack_fp4_kernel(const uint8_t* __restrict__ W, int64_t w_stride, int64_t K, int stripes, int steps, int64_t n_words,
                                   uint32_t* __restrict__ out) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_words) return;
  const int64_t unit = idx / 128;
  const int within = int(idx % 128), lane = within / 4, i = within % 4;
  const int j = int(unit % steps), s = int((unit / steps) % stripes);
  const int64_t e = unit / (int64_t(steps) * stripes);
  uint8_t codes[8];
  for (int p = 0; p < 4; ++p)
    for (int which = 0; which < 2; ++which) {
      const rs::Src src = rs::fragment_src(lane, i, p, which);
      const int64_t row = int64_t(s) * 16 + src.row, k = int64_t(j) * 64 + src.k;
      const uint8_t b = W[e * w_stride + row * (K / 2) + k / 2];
      codes[2 * p + which] = (k & 1) ? uint8_t(b >> 4) : uint8_t(b & 0xF);
    }
  out[idx] = rs::fp4_pack_word(codes);
}

__global__ void rs_pack_fp4_scales_kernel(const uint8_t* __restrict__ S, int64_t s_stride, int64_t K, int stripes, int steps, int64_t n_words,
                                          uint32_t* __restrict__ out, uint8_t* __restrict__ special) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_words) return;
  const int64_t unit = idx / 8;
  const int g = int(idx % 8);
  const int j = int(unit % steps), s = int((unit / steps) % stripes);
  const int64_t e = unit / (int64_t(steps) * stripes), KB = K / 32;
  uint32_t word = 0;
  bool odd = false;
  for (int b = 0; b < 4; ++b) {
    const int64_t row = int64_t(s) * 16 + rs::fp4_scale_row(g, b), blk = int64_t(j) * 2 + rs::fp4_scale_block(b);
    const uint8_t v = S[e * s_stride + row * KB + blk];
    odd = odd || v == 0 || v == 0xFF;
    word |= uint32_t(v) << (8 * b);
  }
  out[idx] = word;
  if (odd) special[e] = 1;
}

__global__ void rs_pack_fp8_kernel(const uint8_t* __restrict__ W, int64_t K, int steps, int64_t n_words, uint32_t* __restrict__ out) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n_words) return;
  const int64_t unit = idx / 256;
  const int within = int(idx % 256), lane = within / 8, wi = within % 8;
  const int j = int(unit % steps);
  const int64_t s = unit / steps;
  uint32_t word = 0;
  for (int b = 0; b < 4; ++b) {
    const rs::Src src = rs::fp8_byte_src(lane, 4 * wi + b);
    const int64_t row = s * 16 + src.row, k = int64_t(j) * 64 + src.k;
    word |= uint32_t(W[row * K + k]) << (8 * b);
  }
  out[idx] = word;
}

// f(std::integral_constant<int, D>{}) for the steps of loads in flight d (2, 4 or 8; the kernels'
// template argument; anything else: 4).
template <typename F>
Status with_depth(int d, F&& f) {
  if (d == 2) return f(std::integral_constant<int, 2>{});
  if (d == 8) return f(std::integral_constant<int, 8>{});
  return f(std::integral_constant<int, 4>{});
}

int64_t blocks_of(int64_t n, int threads) { return (n + threads - 1) / threads; }

int pow2_ceil(int64_t v) {
  int p = 1;
  while (p < v && p < (1 << 20)) p <<= 1;
  return p;
}

template <typename K>
Status launch_with_smem(bool pdl, K kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t st, const char* name, auto&&... args) {
  FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem));
  FB_CUDA_TRY(launch_pdl(pdl, kernel, grid, block, smem, st, std::forward<decltype(args)>(args)...));
  FB_CUDA_LAUNCHED(name);
  return Status();
}

}  // namespace

namespace {

std::atomic<int> g_rs_mode{0};
std::mutex g_reg_mu;
std::map<const uint8_t*, std::unique_ptr<RsWeight>> g_fp8_packed, g_fp4_packed;
std::map<const uint8_t*, int> g_fp4_experts;

}  // namespace

void set_fast_gemv_rs(int mode) { g_rs_mode.store(mode == 1 || mode == 2 ? mode : 0, std::memory_order_relaxed); }
bool fast_gemv_rs() { return g_rs_mode.load(std::memory_order_relaxed) != 0; }
bool fast_gemv_rs_fp4() { return g_rs_mode.load(std::memory_order_relaxed) == 1; }

void rs_register_experts(const uint8_t* w, int experts) {
  std::lock_guard<std::mutex> lock(g_reg_mu);
  g_fp4_experts[w] = experts;
}

void rs_clear_packed() {
  std::lock_guard<std::mutex> lock(g_reg_mu);
  g_fp8_packed.clear();
  g_fp4_packed.clear();
  g_fp4_experts.clear();
}

Result<const RsWeight*> rs_packed_fp8(const Fp8W& w, cudaStream_t st) {
  if (w.N % rs::kStripe != 0 || w.K % rs::kStepK != 0) return static_cast<const RsWeight*>(nullptr);
  std::lock_guard<std::mutex> lock(g_reg_mu);
  auto it = g_fp8_packed.find(w.w);
  if (it != g_fp8_packed.end() && it->second->N == w.N && it->second->K == w.K && it->second->s8 == w.s) return it->second.get();
  auto r = std::make_unique<RsWeight>();
  FB_RETURN_IF_ERROR(rs_pack_fp8(w, r.get(), st));  // stream-ordered before the GEMV that reads it
  const RsWeight* p = r.get();
  g_fp8_packed[w.w] = std::move(r);
  return p;
}

Result<const RsWeight*> rs_packed_fp4(const Fp4W& w, cudaStream_t st) {
  if (w.N % rs::kStripe != 0 || w.K % rs::kStepK != 0) return static_cast<const RsWeight*>(nullptr);
  std::lock_guard<std::mutex> lock(g_reg_mu);
  const auto e = g_fp4_experts.find(w.w);
  if (e == g_fp4_experts.end()) return static_cast<const RsWeight*>(nullptr);
  auto it = g_fp4_packed.find(w.w);
  if (it != g_fp4_packed.end() && it->second->N == w.N && it->second->K == w.K) return it->second.get();
  auto r = std::make_unique<RsWeight>();
  FB_RETURN_IF_ERROR(rs_pack_fp4(w, e->second, r.get(), st));
  const RsWeight* p = r.get();
  g_fp4_packed[w.w] = std::move(r);
  return p;
}

int rs_warps(int64_t N, int64_t K, bool fp4) {
  const int64_t stripes = N / rs::kStripe, steps = K / rs::kStepK;
  const int t8 = g_fp8_target.load(), t4 = g_fp4_target.load();
  const int64_t target = fp4 ? (t4 > 0 ? t4 : kFp4TargetDefault) : (t8 > 0 ? t8 : kFp8TargetDefault);
  int w = std::min(kMaxWarps, pow2_ceil((target + stripes - 1) / std::max<int64_t>(1, stripes)));
  while (w > 1 && steps / w < 4) w /= 2;  // at least 4 steps a warp
  return std::max(1, w);
}

void rs_set_group_rows(int g) { g_group_rows = g == 8 ? 8 : 4; }
void rs_set_token_staging(bool on) { g_tok_stage = on; }
void rs_set_group_ctas(int y) { g_group_ctas = y >= 1 && y <= int(kMaxGroupRows) ? y : kGroupCtasDefault; }

void rs_set_tuning(int fp8_target_warps, int fp4_target_warps, int depth) {
  g_fp8_target = fp8_target_warps;
  g_fp4_target = fp4_target_warps;
  g_depth = depth == 2 || depth == 4 || depth == 8 ? depth : 0;
}

Status rs_pack_fp8(const Fp8W& w, RsWeight* out, cudaStream_t st) {
  if (w.N % rs::kStripe != 0 || w.K % rs::kStepK != 0)
    return FB_ERROR(kUnsupported) << "rs_pack_fp8: [" << w.N << ", " << w.K << "] needs N % 16 == 0 and K % 64 == 0";
  RsWeight r;
  r.N = w.N;
  r.K = w.K;
  r.s8 = w.s;
  const int stripes = int(w.N / rs::kStripe), steps = int(w.K / rs::kStepK);
  FB_RETURN_IF_ERROR(r.w.alloc(size_t(w.N * w.K + int64_t(kPadUnits) * rs::kFp8UnitBytes)));
  FB_CUDA_TRY(cudaMemsetAsync(r.w.get<uint8_t>() + w.N * w.K, 0, size_t(kPadUnits) * rs::kFp8UnitBytes, st));
  const int64_t n_words = int64_t(stripes) * steps * (rs::kFp8UnitBytes / 4);
  rs_pack_fp8_kernel<<<unsigned(blocks_of(n_words, 256)), 256, 0, st>>>(w.w, w.K, steps, n_words, r.w.get<uint32_t>());
  FB_CUDA_LAUNCHED("rs_pack_fp8_kernel");
  *out = std::move(r);
  return Status();
}

Status rs_pack_fp4(const Fp4W& w, int experts, RsWeight* out, cudaStream_t st) {
  if (w.N % rs::kStripe != 0 || w.K % rs::kStepK != 0 || experts < 1)
    return FB_ERROR(kUnsupported) << "rs_pack_fp4: [" << w.N << ", " << w.K << "] x " << experts << " needs N % 16 == 0, K % 64 == 0";
  RsWeight r;
  r.N = w.N;
  r.K = w.K;
  r.experts = experts;
  r.fp4 = true;
  const int stripes = int(w.N / rs::kStripe), steps = int(w.K / rs::kStepK);
  const int64_t units = int64_t(experts) * stripes * steps;
  FB_RETURN_IF_ERROR(r.w.alloc(size_t((units + kPadUnits) * rs::kFp4UnitBytes)));
  FB_RETURN_IF_ERROR(r.s.alloc(size_t((units + kPadUnits) * rs::kFp4ScaleUnitBytes)));
  FB_CUDA_TRY(cudaMemsetAsync(r.w.get<uint8_t>() + units * rs::kFp4UnitBytes, 0, size_t(kPadUnits) * rs::kFp4UnitBytes, st));
  FB_CUDA_TRY(cudaMemsetAsync(r.s.get<uint8_t>() + units * rs::kFp4ScaleUnitBytes, 0, size_t(kPadUnits) * rs::kFp4ScaleUnitBytes, st));
  FB_RETURN_IF_ERROR(r.special.alloc(size_t(experts)));
  FB_CUDA_TRY(cudaMemsetAsync(r.special.get(), 0, size_t(experts), st));
  const int64_t n_words = units * (rs::kFp4UnitBytes / 4), n_scale_words = units * (rs::kFp4ScaleUnitBytes / 4);
  rs_pack_fp4_kernel<<<unsigned(blocks_of(n_words, 256)), 256, 0, st>>>(w.w, w.w_stride, w.K, stripes, steps, n_words, r.w.get<uint32_t>());
  FB_CUDA_LAUNCHED("rs_pack_fp4_kernel");
  rs_pack_fp4_scales_kernel<<<unsigned(blocks_of(n_scale_words, 256)), 256, 0, st>>>(w.s, w.s_stride, w.K, stripes, steps, n_scale_words,
                                                                                    r.s.get<uint32_t>(), r.special.get<uint8_t>());
  FB_CUDA_LAUNCHED("rs_pack_fp4_scales_kernel");
  *out = std::move(r);
  return Status();
}

Status rs_fp8_gemv2(const QuantBuf& q, int64_t M, const RsWeight& wa, uint16_t* ya, const RsWeight* wb, uint16_t* yb, cudaStream_t st, bool pdl) {
  for (const RsWeight* w : {&wa, wb})
    if (w && (w->fp4 || !w->w.get())) return FB_ERROR(kInvalidArgument) << "rs_fp8_gemv: not an FP8 weight packed by rs_pack_fp8";
  if (wb && wb->K != wa.K) return FB_ERROR(kInvalidArgument) << "rs_fp8_gemv2: K " << wa.K << " vs " << wb->K;
  if (M <= 0) return Status();
  const int steps = int(wa.K / rs::kStepK);
  auto part = [&](const RsWeight& w, uint16_t* y) {
    RsFp8Args p;
    p.w = w.w.get<const uint4>();
    p.s = w.s8;
    p.y = y;
    p.N = w.N;
    p.stripes = int(w.N / rs::kStripe);
    p.warps = rs_warps(w.N, w.K, false);
    return p;
  };
  const RsFp8Args pa = part(wa, ya), pb = wb ? part(*wb, yb) : pa;
  const int W = std::max(pa.warps, pb.warps);
  const int cols = int(std::min<int64_t>(M, kFp8Cols));
  const size_t smem = size_t(cols) * steps * 32 * 4 + size_t(kFp8Cols) * steps * 2 * 4 + size_t(W) * 128 * 4;
  const dim3 grid(unsigned(std::max(pa.stripes, pb.stripes)), unsigned((M + kFp8Cols - 1) / kFp8Cols), wb ? 2u : 1u), block(unsigned(W * 32));
  const uint8_t* xc = q.codes;
  const float* xs = q.scales;
  return with_depth(g_depth.load() > 0 ? g_depth.load() : kDepthDefault, [&](auto D) {
    return launch_with_smem(pdl, rs_fp8_kernel<decltype(D)::value>, grid, block, smem, st, "rs_fp8_kernel", xc, xs, M, cols, steps, pa, pb);
  });
}

Status rs_fp8_gemv(const QuantBuf& q, int64_t M, const RsWeight& w, uint16_t* y, cudaStream_t st, bool pdl) {
  return rs_fp8_gemv2(q, M, w, y, nullptr, nullptr, st, pdl);
}

Status rs_fp4_gemv(const QuantBuf& q, int64_t M, int64_t x_div, const RsWeight& wa, uint16_t* ya, const RsWeight* wb, uint16_t* yb,
                   const int32_t* expert, cudaStream_t st, bool pdl, bool group_rows) {
  if (!wa.fp4 || !wa.w.get()) return FB_ERROR(kInvalidArgument) << "rs_fp4_gemv: not an MXFP4 weight packed by rs_pack_fp4";
  if (wb && (!wb->fp4 || wb->N != wa.N || wb->K != wa.K || wb->experts != wa.experts))
    return FB_ERROR(kInvalidArgument) << "rs_fp4_gemv: the second weight's shape differs";
  if (M <= 0) return Status();
  if (x_div < 1) return FB_ERROR(kInvalidArgument) << "rs_fp4_gemv: x_div " << x_div;
  if (M > 65535) return FB_ERROR(kInvalidArgument) << "rs_fp4_gemv: " << M << " rows in one launch";
  const int steps = int(wa.K / rs::kStepK), stripes = int(wa.N / rs::kStripe), W = rs_warps(wa.N, wa.K, true);
  const size_t smem = size_t(steps) * 32 * 4 + size_t(steps) * 2 * 4 + size_t(W) * 16 * 4;
  auto part = [&](const RsWeight& w, uint16_t* y) {
    RsFp4Part p;
    p.w = w.w.get<const uint4>();
    p.s = w.s.get<const uint32_t>();
    p.special = w.special.get<const uint8_t>();
    p.y = y;
    p.N = w.N;
    p.stripes = stripes;
    return p;
  };
  const RsFp4Part pa = part(wa, ya), pb = wb ? part(*wb, yb) : pa;
  const dim3 grid(unsigned(stripes), unsigned(M), wb ? 2u : 1u), block(unsigned(W * 32));
  const uint8_t* xc = q.codes;
  const float* xs = q.scales;
  if (group_rows && expert != nullptr && M > 1 && M <= kMaxGroupRows) {
    const int gmax = g_group_rows.load() == 8 ? 8 : 4;
    // Rows that share token activations (x_div > 1: w1 / w3 of a verify step): the tokens' rows are
    // staged once per CTA when at most 8 and the knob allows, each group's columns reading theirs.
    const int64_t tokens = (M + x_div - 1) / x_div;
    const int ntok = x_div > 1 && tokens <= kFp8Cols && g_tok_stage.load() ? int(tokens) : 0;
    const int cols = ntok > 0 ? ntok : int(std::min<int64_t>(M, gmax));
    // CTAs per stripe: the knob (default 8) with rows staged per group; half of it with the tokens
    // staged once per CTA (each CTA's staging then covers every group it takes: H200 micro-bench,
    // 36 rows of 6 tokens over 8 experts, w1 + w3: 4 CTAs 90.2 us, 8 CTAs 110.7 us, tiles 93.7 us)
    const int64_t ctas = ntok > 0 ? std::max(1, g_group_ctas.load() / 2) : g_group_ctas.load();
    const dim3 ggrid(unsigned(stripes), unsigned(std::min<int64_t>(M, ctas)), wb ? 2u : 1u);
    const size_t gsmem = size_t(cols) * steps * 32 * 4 + size_t(kFp8Cols) * steps * 2 * 4 + size_t(W) * 128 * 4;
    return with_depth(g_depth.load() > 0 ? g_depth.load() : kDepthDefault, [&](auto D) {
      return launch_with_smem(pdl, rs_fp4_grouped_kernel<decltype(D)::value>, ggrid, block, gsmem, st, "rs_fp4_grouped_kernel", xc, xs, x_div,
                              pa, pb, expert, steps, int(M), cols, gmax, ntok);
    });
  }
  return with_depth(g_depth.load() > 0 ? g_depth.load() : kDepthDefault, [&](auto D) {
    return launch_with_smem(pdl, rs_fp4_kernel<decltype(D)::value>, grid, block, smem, st, "rs_fp4_kernel", xc, xs, x_div, pa, pb, expert,
                            steps);
  });
}

}  // namespace fb::cuda
