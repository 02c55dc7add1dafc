// The tensor-core decode GEMVs of tc_gemv.h. One kernel template for both weight formats:
//
//  CTA (128 threads, 4 warps) = one (stripe of 16 output rows, K chunk) of one weight, for one
//  group of 8 activation rows (FP8, blockIdx.y) or one expert row (MXFP4, blockIdx.y = m).
//  1. cp.async copies the weight tile [16][chunk bytes] into shared memory (16-byte units, the
//     unit index XOR-swizzled by the row within each 128-byte group so ldmatrix's 8 row addresses
//     hit 8 distinct bank groups); rows past N are clamped (computed, never stored). Dense FP8
//     tiles are copied before griddepcontrol.wait (weights never depend on the step).
//  2. The weight scales (e8m0 -> f32) and the activations: FP8 rows m0..m0+7 (zeros past M) as
//     raw e4m3 codes, row stride chunk + 16 bytes (conflict-free B loads); the MXFP4 row's codes
//     per 32-block as [even k of words 0..3][odd k of words 0..3], the order in which the e2m1
//     widening delivers the weights (e2m1_lo/hi_e4m3).
//  3. A warp's units u = warp, warp + 4, ...: 32 bytes of every tile row = one FP8 32-block or
//     two MXFP4 32-blocks; one ldmatrix.x4, then per 32-block one mma.m16n8k32 from zero and
//     acc += d * (weight scale * activation scale) (FMA). Lane (g, t) holds d for rows g and g + 8
//     and columns 2t, 2t + 1 (FP8: activation rows; MXFP4: column 0 is the row, the rest zeros).
//  4. The 4 warps' accumulators add in warp order (shared memory), the nk chunks' in rank order
//     (the last CTA to arrive reads the others' partials from the stream's workspace; or rank 0
//     reads the cluster's shared memory), one RNE rounding to bf16.
// Every sum's order is a function of (N, K) only: deterministic and row-invariant.
#include "cuda/tc_gemv.h"

#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <type_traits>

#include "base/check.h"
#include "cuda/device.h"
#include "cuda/fast_small.h"
#include "cuda/numerics.cuh"
#include "cuda/pdl.cuh"

namespace fb::cuda {

namespace cg = cooperative_groups;
using dev::to_bf;

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kStripe = 16;                            // output rows per CTA (the mma's m)
constexpr int kRowGroup = 8;                           // FP8 activation rows per CTA (the mma's n)
// k per chunk: 32 KB of weight tile (micro-bench on the H200, tc_gemv_set_chunk_max sweep 512/1024/
// 2048 for FP8 and 1024/2048/4096 for MXFP4 at the released decode shapes: the largest was fastest
// or equal for every shape, e.g. wq_b 1.30 / 1.73 / 2.32 TB/s with PDL)
constexpr int kFp8ChunkMax = 2048, kFp4ChunkMax = 4096;
constexpr int kMaxChunks = 8;                          // the portable cluster size
constexpr int64_t kMaxGroupRows = 64;                  // MXFP4 row grouping: one warp's ballots over the rows

// One weight of a launch: codes, scales, rows, stripes of 16, output [M, N].
struct TcPart {
  const uint8_t* W = nullptr;
  const uint8_t* S = nullptr;
  int64_t N = 0;
  int64_t stripes = 0;
  uint16_t* y = nullptr;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// 16 bytes global -> shared, bypassing L1; src_bytes 0 writes zeros (the source is not read).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
// 4 bytes global -> shared (src_bytes 0: zeros, the source not read).
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_but_newest() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d = A (16 x 32 e4m3, row) . B (32 x 8 e4m3, col), f32, from zero.
__device__ __forceinline__ void mma_e4m3(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// Eight e2m1 nibbles (nibble i = element i) -> the e4m3 bytes of value * 2^-6, exactly: the
// magnitude bits e1 e0 m go to e4m3 bits 4..2 (exponent 00e1e0, mantissa m00: 2^(e-7) (1 + m/2)
// for e > 0, and e = 0, m = 1 is the subnormal 2^-7 = 0.5 * 2^-6), the sign to bit 7.
// lo: the low nibbles (elements 0, 2, 4, 6) as bytes 0..3; hi: the high nibbles (1, 3, 5, 7).
__device__ __forceinline__ uint32_t e2m1_lo_e4m3(uint32_t w) { return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u); }
__device__ __forceinline__ uint32_t e2m1_hi_e4m3(uint32_t w) { return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u); }

// Two e4m3 codes (low byte = first element) -> the bf16 pair of the same values (exact: e4m3 ->
// f16 -> f32 -> bf16 never rounds), low half = first element.
__device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t two) {
  uint32_t h;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"(uint16_t(two)));
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(f.y), "f"(f.x));
  return r;
}

// d += A (16 x 16 bf16, row) . B (16 x 8 bf16, col), f32.
__device__ __forceinline__ void mma_bf16(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The bf16 activations of MODE kBf16x: x [M, ldx]; output row n reads the K elements at
// (n / grp_rows) * grp_stride (grouped wo_a: o_lora_rank rows per group of o_group_in columns).
struct BfxArgs {
  const uint16_t* x = nullptr;
  int64_t ldx = 0, grp_rows = 1, grp_stride = 0;
};

constexpr int kModeFp8 = 0, kModeFp4 = 1, kModeBf16x = 2;

// The split-K fold through global memory (tc_global_fold): one 32 x float4 partial per (row or
// row group, stripe, chunk) and one arrival counter per (row or row group, stripe). The CTA that
// arrives last sums the partials in rank order (the cluster fold's order: the same bits) and
// returns the counter to zero for the next launch on the stream. parts == nullptr: the cluster fold.
struct FoldWs {
  float4* parts = nullptr;
  unsigned* counters = nullptr;
};

// Byte offset of 16-byte unit j of tile row r (row bytes rb, a multiple of 128).
__device__ __forceinline__ int tile_off(int r, int j, int rb) { return r * rb + (((j & ~7) | ((j ^ r) & 7)) << 4); }

// The MXFP4 lean loop (LL > 0, set_tc_lean_loop): the same tiles, sums and bits with fewer instructions.
// f(r, j) for every unit j < per_row of rows r < rows, threads striding 128 units: one division per
// thread instead of one per unit.
template <typename F>
__device__ __forceinline__ void for_units(int rows, int per_row, F f) {
  int r = int(threadIdx.x) / per_row, j = int(threadIdx.x) - r * per_row;
  const int sr = kThreads / per_row, sj = kThreads - sr * per_row;  // 128 = sr * per_row + sj, sj < per_row
  while (r < rows) {
    f(r, j);
    r += sr;
    j += sj;
    if (j >= per_row) {
      j -= per_row;
      ++r;
    }
  }
}
// dev::e8m0_val without its pow2i branch: c << 23 is the value for c = 1..254, 0x00400000 = 2^-127
// is c = 0's, and 255 is NaN (the lean loop's path for tiles that hold a 0 or 255 scale byte).
__device__ __forceinline__ float e8m0_lean(uint32_t c) {
  const float v = __uint_as_float(max(c << 23, 0x00400000u));
  return c == 0xFFu ? __uint_as_float(0x7FC00000u) : v;
}
// Two e4m3 codes (bytes 0, 1 of v; HI: bytes 2, 3) -> the f16 pair of the same values (exact).
template <bool HI = false>
__device__ __forceinline__ uint32_t e4m3x2_f16x2(uint32_t v) {
  uint32_t h;
  if constexpr (HI) {
    asm("{\n .reg .b16 l, u;\n mov.b32 {l, u}, %1;\n cvt.rn.f16x2.e4m3x2 %0, u;\n}" : "=r"(h) : "r"(v));
  } else {
    asm("{\n .reg .b16 l, u;\n mov.b32 {l, u}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(h) : "r"(v));
  }
  return h;
}
// mma.m16n8k32 e4m3 as sm_90 runs it (the compiler widens both operands to f16 and issues two
// m16n8k16: k 4t, 4t+1 of every fragment register first, then k 4t+2, 4t+3), with the B operand
// already widened (b = {lo(b0), lo(b1), hi(b0), hi(b1)}) and no final "+ 0.0" (the compiler's
// canonicalisation of a -0 sum, which the callers' "acc + d * s" from acc = +0 makes moot).
__device__ __forceinline__ void mma_e4m3_f16b(const uint32_t (&a)[4], const uint4& b, float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(e4m3x2_f16x2(a[0])), "r"(e4m3x2_f16x2(a[1])), "r"(e4m3x2_f16x2(a[2])), "r"(e4m3x2_f16x2(a[3])), "r"(b.x), "r"(b.y), "f"(0.0f));
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(e4m3x2_f16x2<true>(a[0])), "r"(e4m3x2_f16x2<true>(a[1])), "r"(e4m3x2_f16x2<true>(a[2])), "r"(e4m3x2_f16x2<true>(a[3])), "r"(b.z),
        "r"(b.w));
}

// LL (MXFP4 with raw scales only; FP8 / bf16: 0): 0 the plain loop; 1 the lean loop
// (set_tc_lean_loop: tile loops without a division per unit, B staged as the f16 pairs the mma
// runs on, scales widened by a shift); 2 the lean loop with rows grouped by expert (B staged as
// e4m3 words in the loop's order, widened at use).
template <int MODE, int LL>
__global__ void __launch_bounds__(kThreads) tc_gemv_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t M, int64_t x_div,
                                                         TcPart pa, TcPart pb, int K, int nk, int kc_max, int64_t w_stride, int64_t s_stride,
                                                         const int32_t* __restrict__ expert, BfxArgs bx_args, bool async_scales, int xr, bool lean, bool grouped,
                                                         bool rows_x, FoldWs fold, int pdl_mode, int spc) {
  constexpr bool FP4 = MODE == kModeFp4, BFX = MODE == kModeBf16x, LF4 = FP4 && LL > 0;
  if constexpr (LF4) grouped = LL == 2;
  // pdl_mode (MXFP4 experts; ExpertPdl in ops.h): 0 plain; 1 trigger after the wait; 2 read the
  // expert ids (through L2) and copy the tile and scales before the wait
  const bool late_trigger = FP4 && pdl_mode == 1, early = FP4 && pdl_mode == 2;
  if (!late_trigger) pdl_trigger();
  extern __shared__ __align__(16) uint8_t smem[];
  // activation row bytes: e4m3 codes (+16), or bf16 values (+16): conflict-free B loads
  const int rb = FP4 ? kc_max / 2 : kc_max, xrow = (BFX ? 2 * kc_max : kc_max) + 16, kb_max = kc_max / 32;
  // spc > 1 (set_tc_stripes): this CTA runs spc stripes of its chunk one after the other, the next
  // stripe's tile (and raw weight scales) copied into the other of two buffers while this one computes
  const int nbuf = spc > 1 ? 2 : 1, tile_bytes = kStripe * rb;
  uint8_t* const wt0 = smem;                                                       // [nbuf][16][rb]
  // FP8 / BFX stage xr <= 8 activation rows (min(M, 8): one at decode); rows past xr are zeros in
  // registers, as rows past M are zeros in shared memory: the same products either way
  // (MXFP4: xr = 1 expert row, or 8 when grouped: the rows of one expert, see below)
  // LF4: [xr][x4row], per unit (two 32-blocks) and lane t its B words: ungrouped (one row) the 8
  // f16 pairs of mma_e4m3_f16b's B, 32 bytes; grouped (8 rows) the 4 e4m3 words, 16 bytes (half the
  // shared memory: 3 more CTAs per SM), rows 64 bytes apart mod 128 (conflict-free 16-byte loads)
  const int x4row = !LF4 ? kc_max : LL == 1 ? 2 * kc_max + 16 : kc_max + 64;
  uint8_t* xt = wt0 + nbuf * tile_bytes;                                           // FP8 / BFX [xr][xrow]; FP4 [xr][x4row]
  float* xsc = reinterpret_cast<float*>(xt + (FP4 ? xr * x4row : xr * xrow));      // FP8 / FP4 [xr][kb_max]; BFX none
  float* wsc = xsc + (BFX ? 0 : xr * kb_max);                                      // FP8 / BFX [kb_max]; FP4 plain loads [16][kb_max]
  float* red = wsc + (FP4 ? (async_scales && lean ? 0 : kStripe * kb_max) : kb_max);  // [warps][32][4]
  float* part = red + kWarps * 128;                                                // [32][4]
  // raw e8m0 weight scales per buffer, widened at use: FP4 async_scales [16][kb_max]; FP8 with
  // spc > 1 the stripe's one scale row [kb_max] (both by 4-byte cp.async)
  const int wsr_bytes = FP4 ? kStripe * kb_max : spc > 1 ? kb_max : 0;
  uint8_t* const wsr0 = reinterpret_cast<uint8_t*>(part + 128);                    // [nbuf][wsr_bytes]
  // FP4 grouping: count, expert, rows. In the dynamic block, after everything else: a static
  // __shared__ array would move the dynamic block's base off the 128-byte alignment the tile's
  // ldmatrix swizzle relies on (the MXFP4 GEMVs ran 12-15% slower with one, session 11)
  int32_t* grp = reinterpret_cast<int32_t*>(wsr0 + nbuf * wsr_bytes);

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  // rows_x (MXFP4 always; FP8 / bf16 of more than one row group): x = row (group), y = tile (stripe
  // * nk + chunk), so the rows of a tile are scheduled together and read its tile from L2 (rows
  // sharing an expert; FP8 row groups); otherwise x = tile, y = row group.
  // a tile here is (group of spc stripes, chunk), the chunk fastest: a part's groups are
  // ceil(stripes / spc), its last one may hold fewer stripes
  const int64_t tile = rows_x ? int64_t(blockIdx.y) : int64_t(blockIdx.x), xa = (pa.stripes + spc - 1) / spc * nk;
  const bool second = tile >= xa;
  const int64_t bx = second ? tile - xa : tile;
  const int64_t s_first = (bx / nk) * spc, stripe_base = second ? pa.stripes : 0;  // (fold ids count both parts' stripes)
  const int64_t left = (second ? pb.stripes : pa.stripes) - s_first;
  const int ns = left < spc ? int(left) : spc;
  const int64_t N = second ? pb.N : pa.N;
  int64_t n0 = s_first * kStripe;
  uint16_t* __restrict__ y = second ? pb.y : pa.y;
  const uint8_t* W = second ? pb.W : pa.W;
  const uint8_t* S = second ? pb.S : pa.S;
  const int chunk = int(bx % nk), k0 = chunk * kc_max, kc = min(kc_max, K - k0), nb = kc / 32, KB = K / 32;
  const int64_t m = rows_x ? int64_t(blockIdx.x) : int64_t(blockIdx.y);  // FP4: the row; FP8: the row group

  // MXFP4 rows: ungrouped, this CTA computes row m alone (B column 0). Grouped (M <= 64), the rows
  // that chose the same expert share its tile: row m leads a group when the number of earlier rows
  // with its expert is a multiple of 8, and takes that expert's next <= 8 rows from m on as B
  // columns 0..cnt-1; other rows' CTAs return. A row's output is its own mma column, so its bits do
  // not depend on the grouping (test TcFp4GroupedEqualsUngrouped).
  int cnt = 1;
  if constexpr (FP4) {
    if (!early) pdl_wait();  // the expert ids come from the step
    if (late_trigger) pdl_trigger();
    const auto expert_of = [&](int64_t i) { return early ? __ldcg(expert + i) : expert[i]; };
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
        const bool lead = es >= 0 && before % 8 == 0;
        if (lane == 0) {
          grp[0] = lead ? min(8, __popc(from_lo) + __popc(from_hi)) : 0;
          grp[1] = es;
        }
        const unsigned below_lane = (1u << lane) - 1u;
        const int r0 = __popc(from_lo & below_lane), r1 = __popc(from_lo) + __popc(from_hi & below_lane);
        if (lead && ((from_lo >> lane) & 1u) && r0 < 8) grp[2 + r0] = p0;
        if (lead && ((from_hi >> lane) & 1u) && r1 < 8) grp[2 + r1] = p1;
      }
      __syncthreads();
      cnt = grp[0];
      if (cnt == 0) {  // not a leader (or skipped): every CTA of the cluster has this m, all return
        if (early) pdl_wait();  // (every CTA waits: the grid's end implies its predecessor's)
        return;
      }
      e = grp[1];
    } else {
      e = expert ? expert_of(m) : 0;
      if (e < 0) {  // a skipped row: every CTA of the cluster has this row, all return
        if (early) pdl_wait();
        return;
      }
    }
    W += e * w_stride;
    S += e * s_stride;
  }
  // 1. the weight tile of stripe i of this CTA into buffer i & 1, with its raw weight scales:
  // stripe 0 now (dense FP8: before the PDL wait, weights never depend on the step), stripe 1 after
  // the activations, stripe i + 2 once stripe i has been computed
  const auto issue_tile = [&](int i) {
    const int64_t ni0 = (s_first + i) * kStripe;
    uint8_t* const wti = wt0 + (i & 1) * tile_bytes;
    uint8_t* const wsi = wsr0 + (i & 1) * wsr_bytes;
    const int upr = (FP4 ? kc / 2 : kc) / 16;
    const int64_t gstride = FP4 ? K / 2 : K, gk0 = FP4 ? k0 / 2 : k0;
    const auto copy = [&](int r, int j) {
      const int64_t n = ni0 + r < N ? ni0 + r : N - 1;
      cp_async16(smem_u32(wti + tile_off(r, j, rb)), W + n * gstride + gk0 + j * 16, 16);
    };
    if constexpr (LF4) {
      for_units(kStripe, upr, copy);
    } else {
      for (int u = tid; u < kStripe * upr; u += kThreads) copy(u / upr, u % upr);
    }
    if constexpr (FP4) {
      if (async_scales) {
        // the 16 rows' raw scale bytes as 4-byte cp.async beside the tile (one round trip; the plain
        // loop below waits for each iteration's global load: 10 iterations at K = 5120), widened to
        // f32 after the wait
        const int nw = (nb + 3) / 4;  // KB % 4 == 0 and k0 % 128 == 0: aligned, never past the row
        const auto copy4 = [&](int r, int q) {
          const int64_t n = ni0 + r < N ? ni0 + r : N - 1;
          cp_async4(smem_u32(wsi + r * kb_max + 4 * q), S + n * KB + k0 / 32 + 4 * q, 4);
        };
        if constexpr (LF4) {
          for_units(kStripe, nw, copy4);
        } else {
          for (int q = tid; q < kStripe * nw; q += kThreads) copy4(q / nw, q % nw);
        }
      }
    } else if (!BFX && spc > 1) {  // FP8: the stripe's scale row (16 rows inside one 32-row block), raw
      for (int q = tid; q < nb / 4; q += kThreads) cp_async4(smem_u32(wsi + 4 * q), S + (ni0 / 32) * KB + k0 / 32 + 4 * q, 4);
    }
    cp_async_commit();
  };
  issue_tile(0);
  // 2. scales and activations (then stripe 1's tile: the first pass waits for everything but it)
  if constexpr (FP4) {
    if (!async_scales) {
      for (int i = tid; i < kStripe * nb; i += kThreads) {
        const int r = i / nb, b = i % nb;
        const int64_t n = n0 + r < N ? n0 + r : N - 1;
        wsc[r * kb_max + b] = dev::e8m0_val(S[n * KB + k0 / 32 + b]);
      }
    }
    if (early) pdl_wait();  // the activation codes come from the step
    // activation row xm's codes of this chunk, block b, as staged row j: [even codes][odd codes]
    const auto stage = [&](int j, int64_t xm, int b) {
      const uint4* src = reinterpret_cast<const uint4*>(xc + xm * K + k0 + b * 32);
      const uint4 lo = src[0], hi = src[1];
      const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      uint32_t ev[4], od[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        ev[q] = __byte_perm(w[2 * q], w[2 * q + 1], 0x6420);  // codes 8q, 8q+2, 8q+4, 8q+6
        od[q] = __byte_perm(w[2 * q], w[2 * q + 1], 0x7531);  // codes 8q+1, 8q+3, 8q+5, 8q+7
      }
      if constexpr (LL == 1) {  // lane t's B of block b: {lo(ev[t]), lo(od[t]), hi(ev[t]), hi(od[t])} as f16 pairs
#pragma unroll
        for (int q = 0; q < 4; ++q)
          *reinterpret_cast<uint4*>(xt + j * x4row + ((b >> 1) * 4 + q) * 32 + (b & 1) * 16) =
              make_uint4(e4m3x2_f16x2(ev[q]), e4m3x2_f16x2(od[q]), e4m3x2_f16x2<true>(ev[q]), e4m3x2_f16x2<true>(od[q]));
      } else if constexpr (LL == 2) {  // lane t's words of block b: ev[t], od[t]
#pragma unroll
        for (int q = 0; q < 4; ++q) *reinterpret_cast<uint2*>(xt + j * x4row + ((b >> 1) * 4 + q) * 16 + (b & 1) * 8) = make_uint2(ev[q], od[q]);
      } else {
        *reinterpret_cast<uint4*>(xt + j * kc_max + b * 32) = make_uint4(ev[0], ev[1], ev[2], ev[3]);
        *reinterpret_cast<uint4*>(xt + j * kc_max + b * 32 + 16) = make_uint4(od[0], od[1], od[2], od[3]);
      }
      xsc[j * kb_max + b] = xs[xm * KB + k0 / 32 + b];
    };
    if (!grouped) {
      const int64_t xm = m / x_div;
      for (int b = tid; b < nb; b += kThreads) stage(0, xm, b);
    } else {  // rows <= 64, so 32-bit divisions
      for (int i = tid; i < cnt * nb; i += kThreads) {
        const int j = i / nb;
        stage(j, int64_t(grp[2 + j] / int(x_div)), i - j * nb);
      }
    }
  } else if constexpr (BFX) {
    for (int b = tid; b < nb; b += kThreads) wsc[b] = dev::e8m0_val(S[(n0 / 32) * KB + k0 / 32 + b]);
    pdl_wait();  // the activations come from the step
    const int64_t m0 = m * kRowGroup, xoff = (n0 / bx_args.grp_rows) * bx_args.grp_stride + k0;
    const int xupr = kc * 2 / 16;
    for (int u = tid; u < xr * xupr; u += kThreads) {
      const int j = u / xupr, q = u % xupr;
      const bool ok = m0 + j < M;
      const uint8_t* src = reinterpret_cast<const uint8_t*>(bx_args.x + (ok ? (m0 + j) * bx_args.ldx + xoff : 0));
      cp_async16(smem_u32(xt + j * xrow + q * 16), src + (ok ? q * 16 : 0), ok ? 16 : 0);
    }
    cp_async_commit();
  } else {
    if (spc == 1)
      for (int b = tid; b < nb; b += kThreads) wsc[b] = dev::e8m0_val(S[(n0 / 32) * KB + k0 / 32 + b]);
    pdl_wait();  // the activation codes come from the step
    const int64_t m0 = m * kRowGroup;
    const int xupr = kc / 16;
    for (int u = tid; u < xr * xupr; u += kThreads) {
      const int j = u / xupr, q = u % xupr;
      const bool ok = m0 + j < M;
      cp_async16(smem_u32(xt + j * xrow + q * 16), xc + (ok ? (m0 + j) * K + k0 + q * 16 : 0), ok ? 16 : 0);
    }
    cp_async_commit();
    if (async_scales) {  // 4-byte cp.async, zeros past M: one round trip instead of one per iteration
      for (int i = tid; i < xr * nb; i += kThreads) {
        const int j = i / nb, b = i % nb;
        const bool ok = m0 + j < M;
        cp_async4(smem_u32(xsc + j * kb_max + b), xs + (ok ? (m0 + j) * KB + k0 / 32 + b : 0), ok ? 4 : 0);
      }
      cp_async_commit();
    } else {
      for (int i = tid; i < xr * nb; i += kThreads) {
        const int j = i / nb, b = i % nb;
        xsc[j * kb_max + b] = m0 + j < M ? xs[(m0 + j) * KB + k0 / 32 + b] : 0.0f;
      }
    }
  }
  if (ns > 1) issue_tile(1);
  // One pass per stripe: wait for its tile (the first pass also for the activations), leaving the
  // newest group, the next stripe's tile, in flight; compute, fold, store; then the buffer takes
  // stripe i + 2.
  for (int i = 0; i < ns; ++i) {
  if (i + 1 < ns) {
    cp_async_wait_but_newest();
  } else {
    cp_async_wait_all();
  }
  uint8_t* const wt = wt0 + (i & 1) * tile_bytes;
  const uint8_t* const wsr = wsr0 + (i & 1) * wsr_bytes;
  n0 = (s_first + i) * kStripe;
  // LF4: does any weight scale of the tile need dev::e8m0_val's special cases (0: 2^-127, 255: NaN)?
  // Each thread looks at the scale words it copied; the loop widens them by a shift when none does.
  bool special = false;
  if constexpr (LF4) {
    uint32_t any = 0;
    for_units(kStripe, nb / 4, [&](int r, int q) {  // nb % 4 == 0 with async scales
      const uint32_t v = *reinterpret_cast<const uint32_t*>(wsr + r * kb_max + 4 * q);
      any |= __vcmpeq4(v, 0u) | __vcmpeq4(v, ~0u);
    });
    special = __syncthreads_or(any != 0);
  } else {
    __syncthreads();
  }
  if constexpr (FP4) {
    if (async_scales && !lean) {  // CudaRunOptions::tc_lean_smem off: the raw scales to f32 here (same values)
      for (int i = tid; i < kStripe * nb; i += kThreads) {
        const int r = i / nb, b = i % nb;
        wsc[r * kb_max + b] = dev::e8m0_val(wsr[r * kb_max + b]);
      }
      __syncthreads();
    }
  }

  // 3. the mma loop
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int li = lane >> 3, lr = (lane & 7) + 8 * (li & 1);  // ldmatrix: this lane addresses matrix li's row lr
  const int units = FP4 ? (nb + 1) / 2 : nb;
  if constexpr (LF4) {
    // sp: std::true_type when a scale byte of the tile is 0 or 255 (the loop, compiled twice)
    const auto run = [&](auto sp) {
      for (int u = warp; u < units; u += kWarps) {
        uint32_t r[4];
        ldsm_x4(smem_u32(wt + tile_off(lr, 2 * u + (li >> 1), rb)), r);
        // the same terms as the plain loop below in the same order: B pre-widened (8 f16 pairs per
        // lane and unit), the two blocks' raw scales of rows g and g + 8 in one 16-bit load each
        uint4 bx[2] = {make_uint4(0, 0, 0, 0), make_uint4(0, 0, 0, 0)};
        if constexpr (LL == 1) {
          if (g < cnt) {
            const uint4* src = reinterpret_cast<const uint4*>(xt + g * x4row + (u * 4 + t) * 32);
            bx[0] = src[0];
            bx[1] = src[1];
          }
        } else {
          const uint4 w = g < cnt ? *reinterpret_cast<const uint4*>(xt + g * x4row + (u * 4 + t) * 16) : make_uint4(0, 0, 0, 0);
          bx[0] = make_uint4(e4m3x2_f16x2(w.x), e4m3x2_f16x2(w.y), e4m3x2_f16x2<true>(w.x), e4m3x2_f16x2<true>(w.y));
          bx[1] = make_uint4(e4m3x2_f16x2(w.z), e4m3x2_f16x2(w.w), e4m3x2_f16x2<true>(w.z), e4m3x2_f16x2<true>(w.w));
        }
        const uint32_t s0 = *reinterpret_cast<const uint16_t*>(wsr + g * kb_max + 2 * u);
        const uint32_t s8 = *reinterpret_cast<const uint16_t*>(wsr + (g + 8) * kb_max + 2 * u);
        // activation scale x 64 (the e2m1 widening's 2^-6): d * (ws * (sx * 64)) is the plain loop's
        // (d * 64) * (ws * sx), every factor a power of two, exact while the products stay normal
        float2 sx2 = 2 * t < cnt ? *reinterpret_cast<const float2*>(xsc + (2 * t) * kb_max + 2 * u) : make_float2(0.0f, 0.0f);
        float2 sx12 = make_float2(0.0f, 0.0f);
        if (LL == 2 && 2 * t + 1 < cnt) sx12 = *reinterpret_cast<const float2*>(xsc + (2 * t + 1) * kb_max + 2 * u);
        sx2 = make_float2(__fmul_rn(sx2.x, 64.0f), __fmul_rn(sx2.y, 64.0f));
        if constexpr (LL == 2) sx12 = make_float2(__fmul_rn(sx12.x, 64.0f), __fmul_rn(sx12.y, 64.0f));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if (2 * u + h >= nb) break;
          const uint32_t w0 = r[2 * h], w1 = r[2 * h + 1];  // word t of block 2u + h, rows g and g + 8
          const uint32_t a[4] = {e2m1_lo_e4m3(w0), e2m1_lo_e4m3(w1), e2m1_hi_e4m3(w0), e2m1_hi_e4m3(w1)};
          float d[4];
          mma_e4m3_f16b(a, bx[h], d);
          // scale byte h of the pair: c << 23 is 2^(c - 127) for c = 1..254 (no special byte in the tile)
          const uint32_t c0 = (s0 >> (8 * h)) & 0xFFu, c8 = (s8 >> (8 * h)) & 0xFFu;
          const float ws0 = decltype(sp)::value ? e8m0_lean(c0) : __uint_as_float(c0 << 23);
          const float ws8 = decltype(sp)::value ? e8m0_lean(c8) : __uint_as_float(c8 << 23);
          const float sx = h ? sx2.y : sx2.x;
          acc[0] = __fmaf_rn(d[0], __fmul_rn(ws0, sx), acc[0]);
          acc[2] = __fmaf_rn(d[2], __fmul_rn(ws8, sx), acc[2]);
          if constexpr (LL == 2) {
            const float sx1 = h ? sx12.y : sx12.x;
            acc[1] = __fmaf_rn(d[1], __fmul_rn(ws0, sx1), acc[1]);
            acc[3] = __fmaf_rn(d[3], __fmul_rn(ws8, sx1), acc[3]);
          }
        }
      }
    };
    if (special) {
      run(std::true_type{});
    } else {
      run(std::false_type{});
    }
  } else {
    for (int u = warp; u < units; u += kWarps) {
      uint32_t r[4];
      ldsm_x4(smem_u32(wt + tile_off(lr, 2 * u + (li >> 1), rb)), r);
      if constexpr (FP4) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int b = 2 * u + h;
          if (b >= nb) break;
          const uint32_t w0 = r[2 * h], w1 = r[2 * h + 1];  // word t of block b, rows g and g + 8
          const uint32_t a[4] = {e2m1_lo_e4m3(w0), e2m1_lo_e4m3(w1), e2m1_hi_e4m3(w0), e2m1_hi_e4m3(w1)};
          uint32_t b0 = 0, b1 = 0;
          if (g < cnt) {
            b0 = *reinterpret_cast<const uint32_t*>(xt + g * kc_max + b * 32 + 4 * t);
            b1 = *reinterpret_cast<const uint32_t*>(xt + g * kc_max + b * 32 + 16 + 4 * t);
          }
          float d[4];
          mma_e4m3(a, b0, b1, d);
          // D columns 2t, 2t + 1 = the group's rows 2t, 2t + 1 (ungrouped: column 0 only)
          const float sx = 2 * t < cnt ? xsc[(2 * t) * kb_max + b] : 0.0f, sx1 = 2 * t + 1 < cnt ? xsc[(2 * t + 1) * kb_max + b] : 0.0f;
          const bool raw = async_scales && lean;
          const float ws0 = raw ? dev::e8m0_val(wsr[g * kb_max + b]) : wsc[g * kb_max + b];
          const float ws8 = raw ? dev::e8m0_val(wsr[(g + 8) * kb_max + b]) : wsc[(g + 8) * kb_max + b];
          acc[0] = __fmaf_rn(__fmul_rn(d[0], 64.0f), __fmul_rn(ws0, sx), acc[0]);
          acc[2] = __fmaf_rn(__fmul_rn(d[2], 64.0f), __fmul_rn(ws8, sx), acc[2]);
          if (grouped) {
            acc[1] = __fmaf_rn(__fmul_rn(d[1], 64.0f), __fmul_rn(ws0, sx1), acc[1]);
            acc[3] = __fmaf_rn(__fmul_rn(d[3], 64.0f), __fmul_rn(ws8, sx1), acc[3]);
          }
        }
      } else if constexpr (BFX) {
        // The 32-block as two k16 steps over the e4m3 fragment's own k order: step 1 takes k
        // 4t..4t+3 of rows g / g + 8 (r[0], r[1]), step 2 k 16 + 4t.. (r[2], r[3]); the bf16
        // activations are read in the same order (b0 = k 4t, 4t+1; b1 = k 4t+2, 4t+3).
        const int b = u;
        const uint8_t* xb = xt + g * xrow + (b * 32 + 4 * t) * 2;
        const uint2 p0 = g < xr ? *reinterpret_cast<const uint2*>(xb) : make_uint2(0, 0), p1 = g < xr ? *reinterpret_cast<const uint2*>(xb + 32) : make_uint2(0, 0);
        const uint32_t a1[4] = {e4m3x2_bf16x2(r[0]), e4m3x2_bf16x2(r[1]), e4m3x2_bf16x2(r[0] >> 16), e4m3x2_bf16x2(r[1] >> 16)};
        const uint32_t a2[4] = {e4m3x2_bf16x2(r[2]), e4m3x2_bf16x2(r[3]), e4m3x2_bf16x2(r[2] >> 16), e4m3x2_bf16x2(r[3] >> 16)};
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_bf16(a1, p0.x, p0.y, d);
        mma_bf16(a2, p1.x, p1.y, d);
        const float ws = wsc[b];
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = __fmaf_rn(d[i], ws, acc[i]);
      } else {
        const int b = u;
        const uint8_t* xb = xt + g * xrow + b * 32 + 4 * t;
        const uint32_t b0 = g < xr ? *reinterpret_cast<const uint32_t*>(xb) : 0u, b1 = g < xr ? *reinterpret_cast<const uint32_t*>(xb + 16) : 0u;
        float d[4];
        mma_e4m3(r, b0, b1, d);
        const float ws = spc > 1 ? dev::e8m0_val(wsr[b]) : wsc[b];
        const float x0 = 2 * t < xr ? xsc[(2 * t) * kb_max + b] : 0.0f, x1 = 2 * t + 1 < xr ? xsc[(2 * t + 1) * kb_max + b] : 0.0f;
        const float s0 = __fmul_rn(ws, x0), s1 = __fmul_rn(ws, x1);
        acc[0] = __fmaf_rn(d[0], s0, acc[0]);
        acc[1] = __fmaf_rn(d[1], s1, acc[1]);
        acc[2] = __fmaf_rn(d[2], s0, acc[2]);
        acc[3] = __fmaf_rn(d[3], s1, acc[3]);
      }
    }

  }

  // 4. fold: warps in order, then the chunks in rank order (workspace or cluster)
  reinterpret_cast<float4*>(red)[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  __syncthreads();
  if (warp == 0) {
    float4 v = reinterpret_cast<const float4*>(red)[lane];
    for (int w = 1; w < kWarps; ++w) {
      const float4 o = reinterpret_cast<const float4*>(red)[w * 32 + lane];
      v = make_float4(__fadd_rn(v.x, o.x), __fadd_rn(v.y, o.y), __fadd_rn(v.z, o.z), __fadd_rn(v.w, o.w));
    }
    reinterpret_cast<float4*>(part)[lane] = v;
  }
  bool writer = warp == 0;
  cg::cluster_group cluster = cg::this_cluster();
  if (nk > 1 && fold.parts) {
    // no cluster: publish this chunk's partial, count arrivals; the last CTA of the stripe folds
    if (warp == 0) {
      const int64_t id = m * (pa.stripes + pb.stripes) + stripe_base + s_first + i;  // (row [group], stripe)
      const int rank = chunk;
      __stcg(fold.parts + (id * nk + rank) * 32 + lane, reinterpret_cast<const float4*>(part)[lane]);
      __threadfence();
      __syncwarp();
      unsigned old = 0;
      if (lane == 0) old = atomicAdd(fold.counters + id, 1u);
      old = __shfl_sync(~0u, old, 0);
      writer = old == unsigned(nk - 1);
      if (writer) {
        __threadfence();
        const float4* pp = fold.parts + id * nk * 32 + lane;
        float4 v = __ldcg(pp);
        for (int rk = 1; rk < nk; ++rk) {
          const float4 o = __ldcg(pp + rk * 32);
          v = make_float4(__fadd_rn(v.x, o.x), __fadd_rn(v.y, o.y), __fadd_rn(v.z, o.z), __fadd_rn(v.w, o.w));
        }
        reinterpret_cast<float4*>(part)[lane] = v;
        if (lane == 0) fold.counters[id] = 0u;
      }
    }
  } else if (nk > 1) {
    cluster.sync();
    writer = writer && cluster.block_rank() == 0;
    if (writer) {
      float4 v = reinterpret_cast<const float4*>(part)[lane];
      for (int rk = 1; rk < nk; ++rk) {
        const float4 o = reinterpret_cast<const float4*>(cluster.map_shared_rank(part, rk))[lane];
        v = make_float4(__fadd_rn(v.x, o.x), __fadd_rn(v.y, o.y), __fadd_rn(v.z, o.z), __fadd_rn(v.w, o.w));
      }
      reinterpret_cast<float4*>(part)[lane] = v;
    }
  }
  if (writer) {
    const float4 v = reinterpret_cast<const float4*>(part)[lane];
    const int64_t na = n0 + g, nb8 = n0 + g + 8;
    if constexpr (FP4) {
      if (2 * t < cnt) {
        const int64_t r = grouped ? int64_t(grp[2 + 2 * t]) : m;
        if (na < N) y[r * N + na] = to_bf(v.x);
        if (nb8 < N) y[r * N + nb8] = to_bf(v.z);
      }
      if (2 * t + 1 < cnt) {
        const int64_t r = grp[2 + 2 * t + 1];
        if (na < N) y[r * N + na] = to_bf(v.y);
        if (nb8 < N) y[r * N + nb8] = to_bf(v.w);
      }
    } else {
      const int64_t m0 = m * kRowGroup, c0 = m0 + 2 * t, c1 = c0 + 1;
      if (na < N && c0 < M) y[c0 * N + na] = to_bf(v.x);
      if (na < N && c1 < M) y[c1 * N + na] = to_bf(v.y);
      if (nb8 < N && c0 < M) y[c0 * N + nb8] = to_bf(v.z);
      if (nb8 < N && c1 < M) y[c1 * N + nb8] = to_bf(v.w);
    }
  }
  if (nk > 1 && !fold.parts) cluster.sync();  // the other ranks' shared memory stays alive until rank 0 has read it
  if (i + 1 < ns) {
    __syncthreads();  // red, part and buffer i & 1 are free again
    if (i + 2 < ns) issue_tile(i + 2);
  }
  }
}

std::atomic<bool> g_async_scales{true};
std::atomic<bool> g_lean{true};
std::atomic<bool> g_global_fold{true};
std::atomic<bool> g_lean_loop{true};
std::atomic<int64_t> g_cluster_ctas{0};
std::atomic<int64_t> g_stripes{4};
std::atomic<int64_t> g_stripes_kinds{2};  // 1: FP8, 2: MXFP4 grouped (the product's: CudaRunOptions)
std::atomic<int64_t> g_stripe_launches{0};  // launches that ran several stripes per CTA (tests)
// set_tc_stripes: a launch keeps at least this many CTAs (two per SM of the H200's 132)
constexpr int64_t kStripesMinCtas = 264;
std::atomic<int64_t> g_global_folds{0};  // launches that folded through a workspace (tests)

// Fold workspaces, one per stream (launches on one stream never overlap their folds: a kernel's
// fold runs after griddepcontrol.wait, so after the previous launch has finished). Grown outside
// graph capture; a capture that needs more than the stream has folds through the cluster instead.
// At most kMaxFoldStreams streams keep one; the next evicts the oldest after a device sync.
struct FoldSlot {
  cudaStream_t stream = nullptr;
  FoldWs ws;
  int64_t ids = 0;    // counters
  int64_t parts = 0;  // float4 x 32 partials
  uint64_t used = 0;
};
constexpr int kMaxFoldStreams = 8;
std::mutex g_fold_mu;
FoldSlot g_fold[kMaxFoldStreams];
uint64_t g_fold_clock = 0;

void free_slot(FoldSlot& f) {
  cudaFree(f.ws.parts);
  cudaFree(f.ws.counters);
  f = FoldSlot{};
}

// The workspace for ids (row [group], stripe) pairs of nk partials each on stream st, or an
// empty one (the cluster fold) when it cannot be had now.
FoldWs fold_workspace(cudaStream_t st, int64_t ids, int nk) {
  std::lock_guard<std::mutex> lock(g_fold_mu);
  const int64_t parts = ids * nk;
  FoldSlot* slot = nullptr;
  for (FoldSlot& f : g_fold)
    if (f.used && f.stream == st) slot = &f;
  if (slot && slot->ids >= ids && slot->parts >= parts) {
    slot->used = ++g_fold_clock;
    return slot->ws;
  }
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(st, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return FoldWs{};
  if (!slot) {
    slot = &g_fold[0];
    for (FoldSlot& f : g_fold)
      if (f.used < slot->used) slot = &f;
  }
  if (slot->used) {
    if (cudaDeviceSynchronize() != cudaSuccess) return FoldWs{};
    free_slot(*slot);
  }
  const int64_t want_ids = std::max<int64_t>(ids, 4096), want_parts = std::max<int64_t>(parts, 16384);
  FoldSlot f;
  f.stream = st;
  f.ids = want_ids;
  f.parts = want_parts;
  if (cudaMalloc(&f.ws.parts, size_t(want_parts) * 32 * sizeof(float4)) != cudaSuccess ||
      cudaMalloc(&f.ws.counters, size_t(want_ids) * sizeof(unsigned)) != cudaSuccess ||
      cudaMemset(f.ws.counters, 0, size_t(want_ids) * sizeof(unsigned)) != cudaSuccess) {
    free_slot(f);
    cudaGetLastError();
    return FoldWs{};
  }
  f.used = ++g_fold_clock;
  *slot = f;
  return slot->ws;
}

size_t smem_bytes(int mode, int kc_max, int xr, bool raw_scales, int ll, int spc) {
  const bool fp4 = mode == kModeFp4, bfx = mode == kModeBf16x;
  const int kb = kc_max / 32, nbuf = spc > 1 ? 2 : 1;
  const size_t w = size_t(nbuf) * kStripe * (fp4 ? kc_max / 2 : kc_max);
  const size_t x = fp4 ? size_t(xr) * (ll == 1 ? 2 * kc_max + 16 : ll == 2 ? kc_max + 64 : kc_max) : size_t(xr) * ((bfx ? 2 * kc_max : kc_max) + 16);
  const size_t sc = fp4 ? size_t(kb) * 4 * (xr + (raw_scales ? 0 : kStripe)) : bfx ? size_t(kb) * 4 : size_t(kb) * 4 * (xr + 1);
  const size_t raw = fp4 ? size_t(kStripe) * kb : spc > 1 ? size_t(kb) : 0;  // raw weight scales per buffer
  return w + x + sc + size_t(kWarps) * 128 * 4 + 128 * 4 + nbuf * raw + (fp4 ? 10 * 4 : 0);  // + FP4 grouping
}

template <int MODE>
Status launch(const QuantBuf& q, int64_t M, int64_t x_div, const TcPart& pa, const TcPart& pb, int64_t K, int64_t w_stride, int64_t s_stride,
              const int32_t* expert, cudaStream_t st, const BfxArgs& bfx = {}, bool grouped = false, int pdl_mode = 0) {
  constexpr bool FP4 = MODE == kModeFp4;
  const TcChunks ch = tc_chunks(K, FP4);
  // scales by cp.async: FP8 activation scales always (f32 rows); MXFP4 weight scale rows when
  // 4-byte aligned (K % 128 == 0, aligned bases and expert strides)
  const auto a4 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; };
  const bool async_scales = g_async_scales.load(std::memory_order_relaxed) && MODE != kModeBf16x &&
                            (!FP4 || (K % 128 == 0 && s_stride % 4 == 0 && a4(pa.S) && (pb.stripes == 0 || a4(pb.S))));
  // activation rows staged per CTA (lean: only the rows a launch can have; otherwise 8)
  const bool lean = g_lean.load(std::memory_order_relaxed);
  const int xr = FP4 ? (grouped ? kRowGroup : 1) : lean ? int(std::min<int64_t>(kRowGroup, M)) : kRowGroup;
  // the lean loop: MXFP4 with raw scales
  const int ll = FP4 && g_lean_loop.load(std::memory_order_relaxed) && async_scales && lean ? (grouped ? 2 : 1) : 0;
  const auto kernel = !FP4 || ll == 0 ? &tc_gemv_kernel<MODE, 0> : ll == 1 ? &tc_gemv_kernel<MODE, FP4 ? 1 : 0> : &tc_gemv_kernel<MODE, FP4 ? 2 : 0>;
  const int64_t rows = FP4 ? M : (M + kRowGroup - 1) / kRowGroup;
  // stripes per CTA (set_tc_stripes): MXFP4 launches with rows grouped by expert only (verify,
  // draft and multi-session steps: 6 verify rows 16.28 -> 15.12 ms; one token's six experts, FP8
  // launches of one row and of several lost at every S, docs/results.md); the kernel also runs
  // FP8 with 4-byte aligned scale rows that way (TcStripesSameBits, kinds 1), never below
  // kStripesMinCtas CTAs
  const auto a4s = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; };
  int spc = int(std::max<int64_t>(1, g_stripes.load(std::memory_order_relaxed)));
  const int kinds = int(g_stripes_kinds.load(std::memory_order_relaxed));
  if (M == 1 || (FP4 && (!(kinds & 2) || ll != 2)) || (MODE == kModeFp8 && !(kinds & 1))) spc = 1;
  if (MODE == kModeBf16x || (MODE == kModeFp8 && (K % 128 != 0 || !a4s(pa.S) || (pb.stripes > 0 && !a4s(pb.S))))) spc = 1;
  const auto groups = [&](int s) { return rows * ((pa.stripes + s - 1) / s + (pb.stripes + s - 1) / s) * ch.nk; };
  while (spc > 1 && groups(spc) < kStripesMinCtas) --spc;
  const size_t smem = smem_bytes(MODE, ch.kc, xr, async_scales && lean, ll, spc);
  FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem));
  const int64_t tiles = ((pa.stripes + spc - 1) / spc + (pb.stripes + spc - 1) / spc) * ch.nk;
  const bool rows_x = FP4 || (rows > 1 && tiles <= 65535);  // the grid's order only: the same bits
  const int64_t gx = rows_x ? rows : tiles, gy = rows_x ? tiles : rows;
  FB_CHECK(gx < (int64_t(1) << 31) && gy <= 65535) << "tc gemv grid " << gx << " x " << gy;
  // split K folds through global memory (no cluster) when on and a workspace is at hand
  // (one-row launches of at most g_cluster_ctas CTAs fold through the cluster: no serial tail of a
  // last CTA; measured for decode, where the 6-row verify launches of the same grids lost)
  const bool global = ch.nk > 1 && g_global_fold.load(std::memory_order_relaxed) && (M > 1 || rows * tiles > g_cluster_ctas.load(std::memory_order_relaxed));
  const FoldWs fold = global ? fold_workspace(st, rows * (pa.stripes + pb.stripes), ch.nk) : FoldWs{};
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(gx), unsigned(gy));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  int na = 0;
  if (fast_pdl()) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  if (fold.parts) g_global_folds.fetch_add(1, std::memory_order_relaxed);
  if (spc > 1) g_stripe_launches.fetch_add(1, std::memory_order_relaxed);
  if (ch.nk > 1 && !fold.parts) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = rows_x ? 1u : unsigned(ch.nk);  // the nk chunks of a tile
    attr[na].val.clusterDim.y = rows_x ? unsigned(ch.nk) : 1u;
    attr[na].val.clusterDim.z = 1;
    ++na;
  }
  cfg.attrs = na ? attr : nullptr;
  cfg.numAttrs = unsigned(na);
  FB_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, static_cast<const uint8_t*>(q.codes), static_cast<const float*>(q.scales), M, x_div, pa, pb, int(K),
                                 ch.nk, ch.kc, w_stride, s_stride, expert, bfx, async_scales, xr, lean, grouped, rows_x, fold, pdl_mode, spc));
  FB_CUDA_LAUNCHED("tc_gemv_kernel");
  return Status();
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

namespace {
std::atomic<int> g_chunk_max[2] = {kFp8ChunkMax, kFp4ChunkMax};  // [fp4]
}  // namespace

void set_tc_lean_smem(bool on) { g_lean.store(on, std::memory_order_relaxed); }
void set_tc_global_fold(bool on) { g_global_fold.store(on, std::memory_order_relaxed); }
void set_tc_cluster_fold_ctas(int64_t ctas) { g_cluster_ctas.store(ctas, std::memory_order_relaxed); }
void set_tc_stripes(int64_t stripes, int64_t kinds) {
  g_stripes.store(stripes, std::memory_order_relaxed);
  g_stripes_kinds.store(kinds, std::memory_order_relaxed);
}
void set_tc_lean_loop(bool on) { g_lean_loop.store(on, std::memory_order_relaxed); }
bool tc_lean_loop() { return g_lean_loop.load(std::memory_order_relaxed); }
bool tc_global_fold() { return g_global_fold.load(std::memory_order_relaxed); }
int64_t tc_global_fold_launches() { return g_global_folds.load(std::memory_order_relaxed); }
int64_t tc_stripes_launches() { return g_stripe_launches.load(std::memory_order_relaxed); }

void set_tc_async_scales(bool on) { g_async_scales.store(on, std::memory_order_relaxed); }
bool tc_async_scales() { return g_async_scales.load(std::memory_order_relaxed); }

void tc_gemv_set_chunk_max(int fp8_k, int fp4_k) {
  g_chunk_max[0].store(fp8_k > 0 ? fp8_k : kFp8ChunkMax);
  g_chunk_max[1].store(fp4_k > 0 ? fp4_k : kFp4ChunkMax);
}

TcChunks tc_chunks(int64_t K, bool fp4) {
  const int64_t cmax = g_chunk_max[fp4 ? 1 : 0].load(), align = fp4 ? 256 : 128;
  int64_t nk = std::min<int64_t>(kMaxChunks, (K + cmax - 1) / cmax);
  if (nk < 1) nk = 1;
  int64_t kc = ((K + nk - 1) / nk + align - 1) / align * align;
  nk = (K + kc - 1) / kc;  // every chunk non-empty
  return TcChunks{int(nk), int(kc)};
}

Status tc_fp8_gemv(const QuantBuf& q, int64_t M, const Fp8W& wa, uint16_t* ya, const Fp8W* wb, uint16_t* yb, cudaStream_t st) {
  FB_CHECK(wa.K % 32 == 0 && wa.K > 0 && wa.K < (int64_t(1) << 30) && (!wb || wb->K == wa.K)) << "tc fp8 gemv K=" << wa.K;
  FB_CHECK(aligned16(wa.w) && (!wb || aligned16(wb->w)) && aligned16(q.codes)) << "tc fp8 gemv: 16-byte weight rows and codes";
  FB_CHECK(M * wa.K <= q.capacity) << "tc fp8 gemv M=" << M << " capacity=" << q.capacity;
  if (M == 0) return Status();
  auto part = [](const Fp8W& w, uint16_t* y) { return TcPart{w.w, w.s, w.N, (w.N + kStripe - 1) / kStripe, y}; };
  const TcPart pa = part(wa, ya), pb = wb ? part(*wb, yb) : TcPart{};
  if (pa.stripes + pb.stripes == 0) return Status();
  return launch<kModeFp8>(q, M, 1, pa, pb, wa.K, 0, 0, nullptr, st);
}

Status tc_fp4_gemv(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, uint16_t* ya, const Fp4W* wb, uint16_t* yb,
                   const int32_t* expert, cudaStream_t st, bool group_rows, ExpertPdl pdl) {
  FB_CHECK(wa.K % 32 == 0 && wa.K > 0 && wa.K < (int64_t(1) << 30) && x_div >= 1) << "tc fp4 gemv K=" << wa.K << " x_div=" << x_div;
  FB_CHECK(!wb || (wb->N == wa.N && wb->K == wa.K && wb->w_stride == wa.w_stride && wb->s_stride == wa.s_stride)) << "tc fp4 gemv2: shapes differ";
  FB_CHECK(aligned16(wa.w) && (!wb || aligned16(wb->w)) && wa.w_stride % 16 == 0 && aligned16(q.codes)) << "tc fp4 gemv: 16-byte rows";
  FB_CHECK(((M - 1) / x_div + 1) * wa.K <= q.capacity || M == 0) << "tc fp4 gemv M=" << M << " capacity=" << q.capacity;
  if (M == 0 || wa.N == 0) return Status();
  auto part = [](const Fp4W& w, uint16_t* y) { return TcPart{w.w, w.s, w.N, (w.N + kStripe - 1) / kStripe, y}; };
  const TcPart pa = part(wa, ya), pb = wb ? part(*wb, yb) : TcPart{};
  const bool grouped = group_rows && expert != nullptr && M > 1 && M <= kMaxGroupRows;
  return launch<kModeFp4>(q, M, x_div, pa, pb, wa.K, wa.w_stride, wa.s_stride, expert, st, {}, grouped, expert ? int(pdl) : 0);
}

Status tc_fp8_bf16x_gemv(const uint16_t* x, int64_t M, int64_t ldx, int64_t grp_rows, int64_t grp_stride, const Fp8W& w, uint16_t* y,
                         cudaStream_t st) {
  FB_CHECK(w.K % 32 == 0 && w.K > 0 && w.K < (int64_t(1) << 30) && grp_rows > 0 && grp_rows % 32 == 0 && w.N % grp_rows == 0)
      << "tc fp8 x bf16 gemv K=" << w.K << " N=" << w.N << " group rows " << grp_rows;
  FB_CHECK(aligned16(w.w) && aligned16(x) && ldx % 8 == 0 && grp_stride % 8 == 0 && (w.N / grp_rows - 1) * grp_stride + w.K <= ldx)
      << "tc fp8 x bf16 gemv: 16-byte rows, groups inside the row";
  if (M == 0 || w.N == 0) return Status();
  const TcPart pa{w.w, w.s, w.N, (w.N + kStripe - 1) / kStripe, y};
  const QuantBuf none{};
  return launch<kModeBf16x>(none, M, 1, pa, TcPart{}, w.K, 0, 0, nullptr, st, BfxArgs{x, ldx, grp_rows, grp_stride});
}

}  // namespace fb::cuda
