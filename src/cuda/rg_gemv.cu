// The register-streaming decode GEMVs of rg_gemv.h (the layout and the sums are described there).
//
//  CTA = nk warps (rg_chunks(K)) over one stripe of 16 output rows (of part a or b) and one group
//  of 8 activation rows (blockIdx.x); warp w streams K steps [w * iters, (w + 1) * iters) of 128
//  bytes per row, D steps in flight: per step and lane four 16-byte weight loads (rows g, g + 8;
//  slabs 0, 1), four 8-byte activation loads (row g of the group, zero past M), the four blocks'
//  scale bytes and activation scales. A warp's first D steps of weights are loaded before
//  griddepcontrol.wait.
#include "cuda/rg_gemv.h"

#include <algorithm>
#include <atomic>

#include "base/check.h"
#include "cuda/device.h"
#include "cuda/fast_small.h"
#include "cuda/numerics.cuh"
#include "cuda/pdl.cuh"

namespace fb::cuda {

namespace {

constexpr int kStripe = 16;    // output rows per CTA (the mma's m)
constexpr int kRowGroup = 8;   // activation rows per CTA (the mma's n)
constexpr int kMaxWarps = 16;  // warps (K chunks) per CTA
constexpr int kStep = 128;     // bytes of a weight row per step: two 64-byte slabs, four FP8 blocks
constexpr int kDefaultIters = 5;
constexpr int kDefaultDepth = 2;

std::atomic<bool> g_rg{false};
std::atomic<bool> g_rg4{false};
std::atomic<int> g_iters{kDefaultIters};
std::atomic<int> g_depth{kDefaultDepth};

struct RgPart {
  const uint8_t* W = nullptr;
  const uint8_t* S = nullptr;
  int64_t N = 0;
  int64_t stripes = 0;
  uint16_t* y = nullptr;
};

// 16 bytes of weights, read once: not kept in L1; L2 fetches the 256-byte span around them (the
// row's next slabs, which this warp reads in its next steps). volatile: issued where written
// (before griddepcontrol.wait for the first steps).
__device__ __forceinline__ uint4 ld_weights(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

// The f16 pair of e4m3 codes: bytes 0, 1 (lo) or bytes 2, 3 (hi) of v (exact).
__device__ __forceinline__ uint32_t f16_lo(uint32_t v) {
  uint32_t h;
  asm("{\n .reg .b16 l, u;\n mov.b32 {l, u}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(h) : "r"(v));
  return h;
}
__device__ __forceinline__ uint32_t f16_hi(uint32_t v) {
  uint32_t h;
  asm("{\n .reg .b16 l, u;\n mov.b32 {l, u}, %1;\n cvt.rn.f16x2.e4m3x2 %0, u;\n}" : "=r"(h) : "r"(v));
  return h;
}

// d += A (16 x 16 f16, row) . B (16 x 8 f16, col), f32.
__device__ __forceinline__ void mma16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Lane t holds bytes [16t, 16t + 16) of a 64-byte slab (two 32-byte blocks). After the exchange
// with lane t ^ 2, r[b] holds 8 bytes of block b, block-relative byte 16 (t & 1) + 8 (t >> 1).
__device__ __forceinline__ void exchange(const uint4& v, int t, uint32_t (&r)[2][2]) {
  const bool low = t < 2;
  const uint32_t s0 = low ? v.z : v.x, s1 = low ? v.w : v.y;
  const uint32_t q0 = __shfl_xor_sync(~0u, s0, 2), q1 = __shfl_xor_sync(~0u, s1, 2);
  r[0][0] = low ? v.x : q0;
  r[0][1] = low ? v.y : q1;
  r[1][0] = low ? q0 : v.z;
  r[1][1] = low ? q1 : v.w;
}

// e8m0 -> f32 (dev::e8m0_val's values: c << 23 for 1..254, 2^-127 for 0, NaN for 255).
__device__ __forceinline__ float e8m0(uint32_t c) {
  const float v = __uint_as_float(max(c << 23, 0x00400000u));
  return c == 0xFFu ? __uint_as_float(0x7FC00000u) : v;
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// Shared memory per warp: its chunk's activation codes, rows r < xr at r * xrow bytes (xrow =
// chunk bytes + 32: the rows' 8-byte reads of one instruction fall in distinct banks), then their
// scales [xr][chunk blocks]. After all warps' regions: the fold, [nk][32] float4.
// bps: 32-blocks per step (FP8 4, MXFP4 8), i.e. bps * 32 activation bytes per step and row.
__host__ __device__ __forceinline__ int rg_xrow(int iters, int bps) { return iters * bps * 32 + 32; }
__host__ __device__ __forceinline__ int rg_warp_bytes(int iters, int xr, int bps) { return xr * rg_xrow(iters, bps) + xr * iters * bps * 4; }

// A warp stages activation blocks [kb_begin, kb_begin + kb_n) of `rows` rows (row r: activation
// row xrow_of(r)) into its region: codes by 16-byte cp.async, scales by plain loads.
template <typename F>
__device__ __forceinline__ void stage_act(uint8_t* xw, float* sxw, int xrow, int sx_row, int rows, F xrow_of, const uint8_t* xc, const float* xs, int K,
                                          int kb_begin, int kb_n, int lane) {
  const int units = kb_n * 2, KB = K >> 5;  // 16-byte units per row
  for (int u = lane; u < rows * units; u += 32) {
    const int r = u / units, q = u - r * units;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(xw + r * xrow + q * 16)), "l"(xc + xrow_of(r) * int64_t(K) + kb_begin * 32 + q * 16)
                 : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
  for (int u = lane; u < rows * kb_n; u += 32) {
    const int r = u / kb_n, b = u - r * kb_n;
    sxw[r * sx_row + b] = xs[xrow_of(r) * int64_t(KB) + kb_begin + b];
  }
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncwarp();
}

template <int D>
__global__ void __launch_bounds__(kMaxWarps * 32) rg_fp8_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t M, RgPart pa,
                                                               RgPart pb, int K, int iters, int xr) {
  pdl_trigger();
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3, nk = int(blockDim.x) >> 5;
  const int64_t m0 = int64_t(blockIdx.x) * kRowGroup, tile = blockIdx.y;
  const bool second = tile >= pa.stripes;
  const uint8_t* W = second ? pb.W : pa.W;
  const uint8_t* S = second ? pb.S : pa.S;
  uint16_t* y = second ? pb.y : pa.y;
  const int64_t N = second ? pb.N : pa.N, n0 = (second ? tile - pa.stripes : tile) * kStripe;
  const int KB = K >> 5, steps = (K + kStep - 1) / kStep;
  const int s_begin = warp * iters, s_end = min(steps, s_begin + iters);
  const uint8_t* w0 = W + min(n0 + g, N - 1) * int64_t(K) + 16 * t;
  const uint8_t* w8 = W + min(n0 + g + 8, N - 1) * int64_t(K) + 16 * t;
  const uint8_t* ws = S + (n0 / 32) * int64_t(KB) + s_begin * 4;  // the stripe's 32-row scale block, this chunk
  const int half = t >> 1;                        // the block of a slab this lane's 16 bytes are in
  const int xo = 16 * (t & 1) + 8 * (t >> 1);     // block-relative byte of its 8 bytes after the exchange
  const int rows = int(M - m0 < xr ? M - m0 : int64_t(xr));  // activation rows of this group (<= xr staged)
  const int xrow = rg_xrow(iters, 4), kb_begin = s_begin * 4, kb_n = min(KB, s_end * 4) - kb_begin;
  uint8_t* xw = smem + warp * rg_warp_bytes(iters, xr, 4);
  float* sxw = reinterpret_cast<float*>(xw + xr * xrow);

  uint4 w[D][4];   // per stage: row g slab 0, slab 1; row g + 8 slab 0, slab 1
  uint32_t sw[D];  // per stage: the four weight scale bytes
  const auto load_w = [&](int j, int s) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int off = s * kStep + 64 * (q & 1);
      w[j][q] = off + 32 * half + 32 <= K ? ld_weights((q < 2 ? w0 : w8) + off) : make_uint4(0, 0, 0, 0);
    }
    uint32_t b4 = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int kl = (s - s_begin) * 4 + b;
      b4 |= (kl < kb_n ? uint32_t(__ldg(ws + kl)) : 0u) << (8 * b);
    }
    sw[j] = b4;
  };
#pragma unroll
  for (int j = 0; j < D; ++j)
    if (s_begin + j < s_end) load_w(j, s_begin + j);
  pdl_wait();  // the activation codes and scales come from the step
  stage_act(xw, sxw, xrow, iters * 4, rows, [&](int r) { return m0 + r; }, xc, xs, K, kb_begin, kb_n, lane);
  const bool has_x = g < rows, has0 = 2 * t < rows, has1 = 2 * t + 1 < rows;
  const uint8_t* xg = xw + (has_x ? g : 0) * xrow + xo;
  const float* sx0 = sxw + (has0 ? 2 * t : 0) * iters * 4;
  const float* sx1 = sxw + (has1 ? 2 * t + 1 : 0) * iters * 4;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const auto compute = [&](int j, int s) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t r0[2][2], r8[2][2];
      exchange(w[j][h], t, r0);
      exchange(w[j][2 + h], t, r8);
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int i = 2 * h + b, kl = (s - s_begin) * 4 + i;
        if (kl >= kb_n) break;  // the warp's last step past K (uniform)
        const uint2 xv = has_x ? *reinterpret_cast<const uint2*>(xg + kl * 32) : make_uint2(0, 0);
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma16(d, f16_lo(r0[b][0]), f16_lo(r8[b][0]), f16_lo(r0[b][1]), f16_lo(r8[b][1]), f16_lo(xv.x), f16_lo(xv.y));
        mma16(d, f16_hi(r0[b][0]), f16_hi(r8[b][0]), f16_hi(r0[b][1]), f16_hi(r8[b][1]), f16_hi(xv.x), f16_hi(xv.y));
        const float wsc = e8m0((sw[j] >> (8 * i)) & 0xFFu);
        const float sa = __fmul_rn(wsc, has0 ? sx0[kl] : 0.0f), sb = __fmul_rn(wsc, has1 ? sx1[kl] : 0.0f);
        acc[0] = __fmaf_rn(d[0], sa, acc[0]);
        acc[1] = __fmaf_rn(d[1], sb, acc[1]);
        acc[2] = __fmaf_rn(d[2], sa, acc[2]);
        acc[3] = __fmaf_rn(d[3], sb, acc[3]);
      }
    }
  };
  for (int s = s_begin; s < s_end; s += D) {
#pragma unroll
    for (int j = 0; j < D; ++j) {
      if (s + j < s_end) {
        compute(j, s + j);
        if (s + j + D < s_end) load_w(j, s + j + D);
      }
    }
  }
  // the warps' partials in warp order, one rounding
  float4* red = reinterpret_cast<float4*>(smem + nk * rg_warp_bytes(iters, xr, 4));
  red[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  __syncthreads();
  if (warp == 0) {
    float4 v = red[lane];
    for (int i = 1; i < nk; ++i) {
      const float4 o = red[i * 32 + lane];
      v = make_float4(__fadd_rn(v.x, o.x), __fadd_rn(v.y, o.y), __fadd_rn(v.z, o.z), __fadd_rn(v.w, o.w));
    }
    const int64_t na = n0 + g, n8 = na + 8, c0 = m0 + 2 * t, c1 = c0 + 1;
    if (na < N && has0) y[c0 * N + na] = dev::to_bf(v.x);
    if (na < N && has1) y[c1 * N + na] = dev::to_bf(v.y);
    if (n8 < N && has0) y[c0 * N + n8] = dev::to_bf(v.z);
    if (n8 < N && has1) y[c1 * N + n8] = dev::to_bf(v.w);
  }
}

// ---- MXFP4 experts -------------------------------------------------------------------------------

// Lane t holds the 16 bytes of block t of a 64-byte MXFP4 slab (four 32-blocks): words 0..3 =
// elements 8w..8w+7. After the 4 x 4 transpose in the quad (two rounds of two shuffles), o[j] is
// word t of block j: each lane 8 elements of every block, block-relative element 8t.
__device__ __forceinline__ void transpose4(const uint4& v, int t, uint32_t (&o)[4]) {
  const bool low = t < 2, odd = (t & 1) != 0;
  const uint32_t a = __shfl_xor_sync(~0u, low ? v.z : v.x, 2), b = __shfl_xor_sync(~0u, low ? v.w : v.y, 2);
  const uint32_t p0 = low ? v.x : a, p1 = low ? v.y : b, p2 = low ? a : v.z, p3 = low ? b : v.w;
  const uint32_t c = __shfl_xor_sync(~0u, odd ? p0 : p1, 1), d = __shfl_xor_sync(~0u, odd ? p2 : p3, 1);
  o[0] = odd ? c : p0;
  o[1] = odd ? p1 : c;
  o[2] = odd ? d : p2;
  o[3] = odd ? p3 : d;
}

// Eight e2m1 nibbles (nibble i = element i) -> the e4m3 bytes of value * 2^-6 (exact; as
// tc_gemv.cu's widening): lo = elements 0, 2, 4, 6; hi = elements 1, 3, 5, 7.
__device__ __forceinline__ uint32_t e2m1_lo(uint32_t w) { return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u); }
__device__ __forceinline__ uint32_t e2m1_hi(uint32_t w) { return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u); }

// CTA = nk warps over one stripe of 16 rows of expert row m's expert (blockIdx.x = m, blockIdx.y =
// stripe of part a or b); grouped (rows of several tokens, M <= 64): the rows that chose the same
// expert share the stripe's reads as the mma's columns (tc_gemv.cu's rule: row m leads when the
// number of earlier rows with its expert is a multiple of 8 and takes that expert's next <= 8
// rows; other rows' CTAs return). A row's output is its own column: the same bits either way.
// Step = 128 bytes of a weight row = 8 blocks; per block two m16n8k16 on f16 widenings, scaled by
// the row's weight scale x activation scale x 64.
template <int D>
__global__ void __launch_bounds__(kMaxWarps * 32) rg_fp4_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t M, int64_t x_div,
                                                               RgPart pa, RgPart pb, int K, int iters, int64_t w_stride, int64_t s_stride,
                                                               const int32_t* __restrict__ expert, bool grouped, int pdl_mode, bool s8) {
  // pdl_mode (ExpertPdl in ops.h): 0 plain; 1 trigger after the wait; 2 read the expert ids
  // (through L2) and issue the first weight loads before the wait
  const bool late_trigger = pdl_mode == 1, early = pdl_mode == 2;
  if (!late_trigger) pdl_trigger();
  extern __shared__ __align__(16) uint8_t smem[];
  __shared__ int grp[2 + kRowGroup];
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31, g = lane >> 2, t = lane & 3, nk = int(blockDim.x) >> 5;
  const int64_t m = blockIdx.x, tile = blockIdx.y;
  const bool second = tile >= pa.stripes;
  const uint8_t* W = second ? pb.W : pa.W;
  const uint8_t* S = second ? pb.S : pa.S;
  uint16_t* y = second ? pb.y : pa.y;
  const int64_t N = second ? pb.N : pa.N, n0 = (second ? tile - pa.stripes : tile) * kStripe;
  if (!early) pdl_wait();  // the expert ids come from the step
  if (late_trigger) pdl_trigger();
  const auto expert_of = [&](int64_t i) { return early ? __ldcg(expert + i) : expert[i]; };
  int cnt = 1;
  int64_t e = 0;
  if (grouped) {
    if (warp == 0) {
      const int sm = int(m), p0 = lane, p1 = lane + 32;
      const int32_t e0 = p0 < M ? expert_of(p0) : -1, e1 = p1 < M ? expert_of(p1) : -1;
      const int32_t es = __shfl_sync(~0u, sm < 32 ? e0 : e1, sm & 31);
      const unsigned lo = __ballot_sync(~0u, p0 < M && e0 == es), hi = __ballot_sync(~0u, p1 < M && e1 == es);
      const unsigned below_lo = sm < 32 ? (1u << sm) - 1u : ~0u, below_hi = sm < 32 ? 0u : (1u << (sm - 32)) - 1u;
      const int before = __popc(lo & below_lo) + __popc(hi & below_hi);
      const unsigned from_lo = lo & ~below_lo, from_hi = hi & ~below_hi;
      const bool lead = es >= 0 && before % kRowGroup == 0;
      if (lane == 0) {
        grp[0] = lead ? min(kRowGroup, __popc(from_lo) + __popc(from_hi)) : 0;
        grp[1] = es;
      }
      const unsigned below_lane = (1u << lane) - 1u;
      const int r0 = __popc(from_lo & below_lane), r1 = __popc(from_lo) + __popc(from_hi & below_lane);
      if (lead && ((from_lo >> lane) & 1u) && r0 < kRowGroup) grp[2 + r0] = p0;
      if (lead && ((from_hi >> lane) & 1u) && r1 < kRowGroup) grp[2 + r1] = p1;
    }
    __syncthreads();
    cnt = grp[0];
    e = grp[1];
  } else {
    e = expert ? expert_of(m) : 0;
    if (e < 0) cnt = 0;
  }
  if (cnt == 0) {  // not a leader, or a skipped row: the whole CTA returns
    if (early) pdl_wait();  // (every CTA waits: the grid's end implies its predecessor's)
    return;
  }
  W += e * w_stride;
  S += e * s_stride;
  const int RB = K >> 1, KB = K >> 5, steps = (RB + kStep - 1) / kStep;
  const int s_begin = warp * iters, s_end = min(steps, s_begin + iters);
  const int64_t ra = min(n0 + g, N - 1), r8 = min(n0 + g + 8, N - 1);
  const uint8_t* w0 = W + ra * RB + 16 * t;
  const uint8_t* w8 = W + r8 * RB + 16 * t;
  const uint8_t* sc0 = S + ra * KB;
  const uint8_t* sc8 = S + r8 * KB;
  const int xrow = rg_xrow(iters, 8), kb_begin = s_begin * 8, kb_n = min(KB, s_end * 8) - kb_begin;
  uint8_t* xw = smem + warp * rg_warp_bytes(iters, grouped ? kRowGroup : 1, 8);
  float* sxw = reinterpret_cast<float*>(xw + (grouped ? kRowGroup : 1) * xrow);

  uint4 w[D][4];      // per stage: row g slab 0, slab 1; row g + 8 slab 0, slab 1
  uint2 sw[D][2];     // per stage: rows g and g + 8, the 8 blocks' scale bytes
  const auto load_w = [&](int j, int s) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int off = s * kStep + 64 * (q & 1);
      w[j][q] = (off >> 4) + t < KB ? ld_weights((q < 2 ? w0 : w8) + off) : make_uint4(0, 0, 0, 0);
    }
    const int kb = s * 8;
    if (s8 && kb + 8 <= KB) {
      sw[j][0] = __ldg(reinterpret_cast<const uint2*>(sc0 + kb));
      sw[j][1] = __ldg(reinterpret_cast<const uint2*>(sc8 + kb));
    } else {
      uint32_t v[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int b = 0; b < 8; ++b)
        if (kb + b < KB) {
          v[b >> 2] |= uint32_t(__ldg(sc0 + kb + b)) << (8 * (b & 3));
          v[2 + (b >> 2)] |= uint32_t(__ldg(sc8 + kb + b)) << (8 * (b & 3));
        }
      sw[j][0] = make_uint2(v[0], v[1]);
      sw[j][1] = make_uint2(v[2], v[3]);
    }
  };
#pragma unroll
  for (int j = 0; j < D; ++j)
    if (s_begin + j < s_end) load_w(j, s_begin + j);
  if (early) pdl_wait();  // the activation codes come from the step
  const int64_t xm0 = m / x_div;
  stage_act(xw, sxw, xrow, iters * 8, cnt, [&](int r) { return grouped ? int64_t(grp[2 + r]) / x_div : xm0; }, xc, xs, K, kb_begin, kb_n, lane);
  const bool has_x = g < cnt, has0 = 2 * t < cnt, has1 = 2 * t + 1 < cnt;
  const uint8_t* xg = xw + (has_x ? g : 0) * xrow + 8 * t;
  const float* sx0 = sxw + (has0 ? 2 * t : 0) * iters * 8;
  const float* sx1 = sxw + (has1 ? 2 * t + 1 : 0) * iters * 8;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const auto compute = [&](int j, int s) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      uint32_t a0[4], a8[4];
      transpose4(w[j][h], t, a0);
      transpose4(w[j][2 + h], t, a8);
      const uint32_t s0 = h ? sw[j][0].y : sw[j][0].x, s8w = h ? sw[j][1].y : sw[j][1].x;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        const int kl = (s - s_begin) * 8 + 4 * h + b;
        if (kl >= kb_n) break;  // the warp's last step past K (uniform)
        const uint2 xv = has_x ? *reinterpret_cast<const uint2*>(xg + kl * 32) : make_uint2(0, 0);
        const uint32_t ev = __byte_perm(xv.x, xv.y, 0x6420), od = __byte_perm(xv.x, xv.y, 0x7531);
        const uint32_t lo0 = e2m1_lo(a0[b]), hi0 = e2m1_hi(a0[b]), lo8 = e2m1_lo(a8[b]), hi8 = e2m1_hi(a8[b]);
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma16(d, f16_lo(lo0), f16_lo(lo8), f16_hi(lo0), f16_hi(lo8), f16_lo(ev), f16_hi(ev));
        mma16(d, f16_lo(hi0), f16_lo(hi8), f16_hi(hi0), f16_hi(hi8), f16_lo(od), f16_hi(od));
        const float ws0 = e8m0((s0 >> (8 * b)) & 0xFFu), ws8 = e8m0((s8w >> (8 * b)) & 0xFFu);
        // activation scale x 64 (the widening's 2^-6); every factor a power of two
        const float x0 = has0 ? __fmul_rn(sx0[kl], 64.0f) : 0.0f, x1 = has1 ? __fmul_rn(sx1[kl], 64.0f) : 0.0f;
        acc[0] = __fmaf_rn(d[0], __fmul_rn(ws0, x0), acc[0]);
        acc[1] = __fmaf_rn(d[1], __fmul_rn(ws0, x1), acc[1]);
        acc[2] = __fmaf_rn(d[2], __fmul_rn(ws8, x0), acc[2]);
        acc[3] = __fmaf_rn(d[3], __fmul_rn(ws8, x1), acc[3]);
      }
    }
  };
  for (int s = s_begin; s < s_end; s += D) {
#pragma unroll
    for (int j = 0; j < D; ++j) {
      if (s + j < s_end) {
        compute(j, s + j);
        if (s + j + D < s_end) load_w(j, s + j + D);
      }
    }
  }
  float4* red = reinterpret_cast<float4*>(smem + nk * rg_warp_bytes(iters, grouped ? kRowGroup : 1, 8));
  red[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  __syncthreads();
  if (warp == 0) {
    float4 v = red[lane];
    for (int i = 1; i < nk; ++i) {
      const float4 o = red[i * 32 + lane];
      v = make_float4(__fadd_rn(v.x, o.x), __fadd_rn(v.y, o.y), __fadd_rn(v.z, o.z), __fadd_rn(v.w, o.w));
    }
    const int64_t na = n0 + g, n8 = na + 8;
    if (has0) {
      const int64_t r = grouped ? int64_t(grp[2 + 2 * t]) : m;
      if (na < N) y[r * N + na] = dev::to_bf(v.x);
      if (n8 < N) y[r * N + n8] = dev::to_bf(v.z);
    }
    if (has1) {
      const int64_t r = grp[2 + 2 * t + 1];
      if (na < N) y[r * N + na] = dev::to_bf(v.y);
      if (n8 < N) y[r * N + n8] = dev::to_bf(v.w);
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void set_fast_gemv_rg(bool on) { g_rg.store(on, std::memory_order_relaxed); }
bool fast_gemv_rg() { return g_rg.load(std::memory_order_relaxed); }
void set_fast_gemv_rg4(bool on) { g_rg4.store(on, std::memory_order_relaxed); }
bool fast_gemv_rg4() { return g_rg4.load(std::memory_order_relaxed); }

void rg_gemv_set_iters(int iters) { g_iters.store(iters > 0 ? iters : kDefaultIters); }

RgChunks rg_chunks(int64_t row_bytes) {
  const int64_t steps = (row_bytes + kStep - 1) / kStep, target = g_iters.load();
  int64_t nk = std::clamp<int64_t>((steps + target - 1) / target, 1, kMaxWarps);
  const int64_t iters = (steps + nk - 1) / nk;
  nk = (steps + iters - 1) / iters;  // every warp has a step
  return RgChunks{int(nk), int(iters)};
}

Status rg_fp8_gemv(const QuantBuf& q, int64_t M, const Fp8W& wa, uint16_t* ya, const Fp8W* wb, uint16_t* yb, cudaStream_t st) {
  FB_CHECK(wa.K % 32 == 0 && wa.K > 0 && wa.K < (int64_t(1) << 30) && (!wb || wb->K == wa.K)) << "rg fp8 gemv K=" << wa.K;
  FB_CHECK(aligned16(wa.w) && (!wb || aligned16(wb->w)) && aligned16(q.codes)) << "rg fp8 gemv: 16-byte weight rows and codes";
  FB_CHECK(M * wa.K <= q.capacity) << "rg fp8 gemv M=" << M << " capacity=" << q.capacity;
  if (M == 0) return Status();
  const auto part = [](const Fp8W& w, uint16_t* y) { return RgPart{w.w, w.s, w.N, (w.N + kStripe - 1) / kStripe, y}; };
  const RgPart pa = part(wa, ya), pb = wb ? part(*wb, yb) : RgPart{};
  const int64_t tiles = pa.stripes + pb.stripes, groups = (M + kRowGroup - 1) / kRowGroup;
  if (tiles == 0) return Status();
  FB_CHECK(tiles <= 65535 && groups < (int64_t(1) << 31)) << "rg fp8 gemv grid " << groups << " x " << tiles;
  const RgChunks ch = rg_chunks(wa.K);
  const int xr = int(std::min<int64_t>(kRowGroup, M));  // activation rows a CTA stages
  const size_t smem = size_t(ch.nk) * (rg_warp_bytes(ch.iters, xr, 4) + 32 * 16);
  const dim3 grid{unsigned(groups), unsigned(tiles)}, block{unsigned(32 * ch.nk)};
  const auto kernel = g_depth.load(std::memory_order_relaxed) == 3 ? rg_fp8_kernel<3> : rg_fp8_kernel<2>;
  FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem));
  FB_CUDA_TRY(launch_pdl(fast_pdl(), kernel, grid, block, smem, st, static_cast<const uint8_t*>(q.codes), static_cast<const float*>(q.scales), M, pa,
                         pb, int(wa.K), ch.iters, xr));
  FB_CUDA_LAUNCHED("rg_fp8_kernel");
  return Status();
}

Status rg_fp4_gemv(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, uint16_t* ya, const Fp4W* wb, uint16_t* yb, const int32_t* expert,
                   cudaStream_t st, bool group_rows, ExpertPdl pdl) {
  FB_CHECK(wa.K % 32 == 0 && wa.K > 0 && wa.K < (int64_t(1) << 30) && x_div >= 1) << "rg fp4 gemv K=" << wa.K << " x_div=" << x_div;
  FB_CHECK(!wb || (wb->N == wa.N && wb->K == wa.K && wb->w_stride == wa.w_stride && wb->s_stride == wa.s_stride)) << "rg fp4 gemv2: shapes differ";
  FB_CHECK(aligned16(wa.w) && (!wb || aligned16(wb->w)) && wa.w_stride % 16 == 0 && (wa.K / 2) % 16 == 0 && aligned16(q.codes))
      << "rg fp4 gemv: 16-byte rows";
  FB_CHECK(((M - 1) / x_div + 1) * wa.K <= q.capacity || M == 0) << "rg fp4 gemv M=" << M << " capacity=" << q.capacity;
  if (M == 0 || wa.N == 0) return Status();
  const auto part = [](const Fp4W& w, uint16_t* y) { return RgPart{w.w, w.s, w.N, (w.N + kStripe - 1) / kStripe, y}; };
  const RgPart pa = part(wa, ya), pb = wb ? part(*wb, yb) : RgPart{};
  const int64_t tiles = pa.stripes + pb.stripes;
  FB_CHECK(tiles <= 65535 && M < (int64_t(1) << 31)) << "rg fp4 gemv grid " << M << " x " << tiles;
  const bool grouped = group_rows && expert != nullptr && M > 1 && M <= 64;
  const RgChunks ch = rg_chunks(wa.K / 2);
  const size_t smem = size_t(ch.nk) * (rg_warp_bytes(ch.iters, grouped ? kRowGroup : 1, 8) + 32 * 16);
  // 8-byte scale loads when every row's scales start 8-byte aligned
  const auto a8 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; };
  const bool s8 = (wa.K / 32) % 8 == 0 && wa.s_stride % 8 == 0 && a8(wa.s) && (!wb || a8(wb->s));
  const dim3 grid{unsigned(M), unsigned(tiles)}, block{unsigned(32 * ch.nk)};
  const auto kernel = g_depth.load(std::memory_order_relaxed) == 3 ? rg_fp4_kernel<3> : rg_fp4_kernel<2>;
  FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem));
  FB_CUDA_TRY(launch_pdl(fast_pdl(), kernel, grid, block, smem, st, static_cast<const uint8_t*>(q.codes), static_cast<const float*>(q.scales), M, x_div,
                         pa, pb, int(wa.K), ch.iters, wa.w_stride, wa.s_stride, expert, grouped, expert ? int(pdl) : 0, s8));
  FB_CUDA_LAUNCHED("rg_fp4_kernel");
  return Status();
}

void rg_gemv_set_depth(int depth) { g_depth.store(depth == 3 ? 3 : kDefaultDepth); }

}  // namespace fb::cuda
