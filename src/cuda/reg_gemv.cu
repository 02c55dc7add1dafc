// The register-streaming decode GEMVs of tc_gemv.h (set_tc_reg_stream) [fast].
//
// Why: the tile kernels of tc_gemv.cu copy a CTA's whole weight tile into shared memory, wait for
// all of it, then compute; a CTA holds its shared memory through the math, the reductions and the
// cluster barrier, so fewer bytes are in flight than the HBM needs. Measured on the H200 (session
// 11, FastGemv.Bench read probes): the same tile geometry with no math reads wq_b's 40 MB in 12.5
// us (3.4 TB/s), the tile kernel takes 18-21 us.
//
// Here the weights go from global memory straight into the mma's A fragments in registers:
//  * CTA = 8 warps = one (stripe of 16 weight rows, K range of the stripe) for one group of 8
//    activation rows (FP8) or one expert row (MXFP4). The K ranges (ranks) of a stripe form a
//    thread-block cluster; their number P comes from K alone (<= 2048 FP8 / 4096 MXFP4 elements
//    per rank). Each warp owns a contiguous run of 32-blocks of the rank's range.
//  * Lane (g, t) loads, per 32-block, 8 bytes of weight rows g and g + 8 (FP8: bytes 8t..8t+7;
//    MXFP4: the 4-byte word t, 8 nibbles), i.e. its A fragment under a fixed permutation of k
//    inside the block; the activations are staged in shared memory once per CTA in the same
//    permuted k order (FP8: as stored, the permutation is in the load; MXFP4: even / odd codes as
//    the nibble widening delivers them), so every product is the reference's.
//  * Loads run U blocks ahead in two register buffers: one batch is in flight while the other is
//    multiplied. Dense FP8 weights (never written by the step) are requested before
//    griddepcontrol.wait, so their first batch overlaps the previous kernel's tail.
//  * Each block's mma starts from zero and is scaled into f32 accumulators by weight scale x
//    activation scale (FMA), in block order per warp; the warps' partials add in warp order in
//    shared memory, the ranks' in rank order through the cluster's shared memory; one RNE to bf16.
// Every sum's order is a function of (N, K) only: deterministic and row-invariant (an mma's output
// column depends on its own B column only).
#include "cuda/reg_gemv.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>

#include "base/check.h"
#include "cuda/device.h"
#include "cuda/fast_small.h"
#include "cuda/numerics.cuh"
#include "cuda/pdl.cuh"

namespace fb::cuda {

namespace cg = cooperative_groups;
using dev::to_bf;

namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kStripe = 16;      // weight rows per CTA (the mma's m)
constexpr int kRowGroup = 8;     // FP8 activation rows per CTA (the mma's n)
constexpr int kFp8RankMax = 2048, kFp4RankMax = 4096;  // K elements per rank at most
constexpr int kMaxRanks = 8;     // the portable cluster size
constexpr int kXPad = 32;        // FP8 activation row pad: 8-byte B loads free of bank conflicts
constexpr int kFp8U = 4, kFp4U = 8;  // blocks per batch (two batches in flight per warp)

struct RgPart {
  const uint8_t* W = nullptr;
  const uint8_t* S = nullptr;
  int64_t N = 0;
  int64_t stripes = 0;
  uint16_t* y = nullptr;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.commit_group;\ncp.async.wait_all;" ::: "memory"); }

// Streaming weight loads: not kept in L1; PF asks L2 to fetch the whole 256-byte line pair.
template <bool PF>
__device__ __forceinline__ uint2 ldw8(const uint8_t* p) {
  uint2 v;
  if constexpr (PF) asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  else asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
template <bool PF>
__device__ __forceinline__ uint32_t ldw4(const uint8_t* p) {
  uint32_t v;
  if constexpr (PF) asm volatile("ld.global.nc.L1::no_allocate.L2::256B.u32 %0, [%1];" : "=r"(v) : "l"(p));
  else asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
// Scale bytes: small, reread by neighbouring blocks, so through L1.
__device__ __forceinline__ uint32_t lds8(const uint8_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.u8 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ int64_t row_at(int64_t n, int64_t N) { return n < N ? n : N - 1; }  // rows past N: computed, never stored

// d = A (16 x 32 e4m3, row) . B (32 x 8 e4m3, col), f32, from zero.
__device__ __forceinline__ void mma_e4m3(const uint32_t (&a)[4], uint32_t b0, uint32_t b1, float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// e2m1 nibbles -> e4m3 bytes of value * 2^-6 (as tc_gemv.cu): lo = elements 0, 2, 4, 6; hi = 1, 3, 5, 7.
__device__ __forceinline__ uint32_t e2m1_lo_e4m3(uint32_t w) { return ((w << 2) & 0x1C1C1C1Cu) | ((w << 4) & 0x80808080u); }
__device__ __forceinline__ uint32_t e2m1_hi_e4m3(uint32_t w) { return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u); }

// ---- FP8 ------------------------------------------------------------------------------------------

template <int U, bool PF>
__device__ __forceinline__ void fp8_load(uint2 (&a)[U][2], uint32_t (&sw)[U], const uint8_t* w0, const uint8_t* w1, const uint8_t* ws, int kb,
                                         int kend) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (kb + u < kend) {
      a[u][0] = ldw8<PF>(w0 + int64_t(kb + u) * 32);
      a[u][1] = ldw8<PF>(w1 + int64_t(kb + u) * 32);
      sw[u] = lds8(ws + kb + u);
    }
  }
}

// One batch: per block, B = activation rows g (bytes 8t..8t+7 of the staged block) when the row
// exists, one mma, acc += d * (weight scale * activation scale of the D column's row).
template <int U>
__device__ __forceinline__ void fp8_math(const uint2 (&a)[U][2], const uint32_t (&sw)[U], int kb, int kend, int c_lo, const uint8_t* xg, bool g_ok,
                                         const float* xsc, int t, float (&acc)[4]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (kb + u < kend) {
      const int lb = kb + u - c_lo;
      uint32_t b0 = 0, b1 = 0;
      if (g_ok) {
        const uint2 bv = *reinterpret_cast<const uint2*>(xg + lb * 32);
        b0 = bv.x;
        b1 = bv.y;
      }
      const uint32_t af[4] = {a[u][0].x, a[u][1].x, a[u][0].y, a[u][1].y};
      float d[4];
      mma_e4m3(af, b0, b1, d);
      const float wsv = dev::e8m0_val(uint8_t(sw[u]));
      const float2 sx = *reinterpret_cast<const float2*>(xsc + lb * kRowGroup + 2 * t);
      const float s0 = __fmul_rn(wsv, sx.x), s1 = __fmul_rn(wsv, sx.y);
      acc[0] = __fmaf_rn(d[0], s0, acc[0]);
      acc[1] = __fmaf_rn(d[1], s1, acc[1]);
      acc[2] = __fmaf_rn(d[2], s0, acc[2]);
      acc[3] = __fmaf_rn(d[3], s1, acc[3]);
    }
  }
}

// The warps' partials in warp order, then the ranks' in rank order (rank 0 holds the sum; its warp 0
// lanes return true). red: [kWarps][32] float4, part: [32] float4.
__device__ __forceinline__ bool fold(const float (&acc)[4], float4* red, float4* part, int P, int warp, int lane, float4* out) {
  red[warp * 32 + lane] = make_float4(acc[0], acc[1], acc[2], acc[3]);
  __syncthreads();
  if (warp == 0) {
    float4 v = red[lane];
    for (int w = 1; w < kWarps; ++w) {
      const float4 o = red[w * 32 + lane];
      v = make_float4(__fadd_rn(v.x, o.x), __fadd_rn(v.y, o.y), __fadd_rn(v.z, o.z), __fadd_rn(v.w, o.w));
    }
    part[lane] = v;
  }
  bool writer = warp == 0;
  if (P > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    writer = writer && cluster.block_rank() == 0;
    if (writer) {
      float4 v = part[lane];
      for (int rk = 1; rk < P; ++rk) {
        const float4 o = cluster.map_shared_rank(part, rk)[lane];
        v = make_float4(__fadd_rn(v.x, o.x), __fadd_rn(v.y, o.y), __fadd_rn(v.z, o.z), __fadd_rn(v.w, o.w));
      }
      part[lane] = v;
    }
  }
  if (writer) *out = part[lane];
  return writer;
}

// grid (row groups of 8, tiles = stripes x P); cluster (1, P).
template <int U, bool PF>
__global__ void __launch_bounds__(kThreads) rg_fp8_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t M, RgPart pa, RgPart pb,
                                                        int K, int P) {
  pdl_trigger();
  extern __shared__ __align__(16) uint8_t smem[];
  const int KB = K / 32, cmax = (KB + P - 1) / P, xrow = cmax * 32 + kXPad;
  uint8_t* xt = smem;                                                    // [8][xrow] codes of the rank's range
  float* xsc = reinterpret_cast<float*>(smem + kRowGroup * xrow);        // [cmax][8] activation scales
  float4* red = reinterpret_cast<float4*>(xsc + cmax * kRowGroup);       // [kWarps][32]
  float4* part = red + kWarps * 32;                                      // [32]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int64_t tile = blockIdx.y, sa = pa.stripes * P;
  const bool second = tile >= sa;
  const int64_t bt = second ? tile - sa : tile;
  const int rank = int(bt % P);
  const int64_t N = second ? pb.N : pa.N, n0 = (bt / P) * kStripe;
  const uint8_t* W = second ? pb.W : pa.W;
  const uint8_t* S = second ? pb.S : pa.S;
  uint16_t* y = second ? pb.y : pa.y;
  const int c_lo = int(int64_t(KB) * rank / P), c_hi = int(int64_t(KB) * (rank + 1) / P), nc = c_hi - c_lo;
  const int w_lo = c_lo + nc * warp / kWarps, w_hi = c_lo + nc * (warp + 1) / kWarps;
  const uint8_t* w0 = W + row_at(n0 + g, N) * K + 8 * t;
  const uint8_t* w1 = W + row_at(n0 + g + 8, N) * K + 8 * t;
  const uint8_t* ws = S + (n0 / 32) * KB;  // one scale row per 32 weight rows: a stripe has one

  uint2 a0[U][2], a1[U][2];
  uint32_t s0[U], s1[U];
  int kb = w_lo;
  fp8_load<U, PF>(a0, s0, w0, w1, ws, kb, w_hi);  // weights only: before the wait
  pdl_wait();
  // the rank's activation codes and scales, rows m0..m0+7 (codes of rows past M never read; scales 0)
  const int64_t m0 = int64_t(blockIdx.x) * kRowGroup;
  {
    const int upr = nc * 2;  // 16-byte units per row
    for (int u = tid; u < kRowGroup * upr; u += kThreads) {
      const int j = u / upr, q = u % upr;
      if (m0 + j < M) cp_async16(smem_u32(xt + j * xrow + q * 16), xc + (m0 + j) * K + int64_t(c_lo) * 32 + q * 16, 16);
    }
    for (int i = tid; i < kRowGroup * nc; i += kThreads) {
      const int lb = i / kRowGroup, j = i % kRowGroup;
      const bool ok = m0 + j < M;
      cp_async4(smem_u32(xsc + i), xs + (ok ? (m0 + j) * KB + c_lo + lb : 0), ok ? 4 : 0);
    }
    cp_async_wait_all();
    __syncthreads();
  }
  const bool g_ok = m0 + g < M;
  const uint8_t* xg = xt + g * xrow + 8 * t;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  while (kb < w_hi) {
    fp8_load<U, PF>(a1, s1, w0, w1, ws, kb + U, w_hi);
    fp8_math<U>(a0, s0, kb, w_hi, c_lo, xg, g_ok, xsc, t, acc);
    kb += U;
    if (kb >= w_hi) break;
    fp8_load<U, PF>(a0, s0, w0, w1, ws, kb + U, w_hi);
    fp8_math<U>(a1, s1, kb, w_hi, c_lo, xg, g_ok, xsc, t, acc);
    kb += U;
  }
  float4 v;
  if (fold(acc, red, part, P, warp, lane, &v)) {
    const int64_t na = n0 + g, nb8 = n0 + g + 8, c0 = m0 + 2 * t, c1 = c0 + 1;
    if (na < N && c0 < M) y[c0 * N + na] = to_bf(v.x);
    if (na < N && c1 < M) y[c1 * N + na] = to_bf(v.y);
    if (nb8 < N && c0 < M) y[c0 * N + nb8] = to_bf(v.z);
    if (nb8 < N && c1 < M) y[c1 * N + nb8] = to_bf(v.w);
  }
  if (P > 1) cg::this_cluster().sync();  // the other ranks' shared memory lives until rank 0 has read it
}

// ---- MXFP4 experts --------------------------------------------------------------------------------

template <int U, bool PF>
__device__ __forceinline__ void fp4_load(uint32_t (&a)[U][2], uint32_t (&sw)[U][2], const uint8_t* w0, const uint8_t* w1, const uint8_t* s0,
                                         const uint8_t* s1, int kb, int kend) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (kb + u < kend) {
      a[u][0] = ldw4<PF>(w0 + int64_t(kb + u) * 16);
      a[u][1] = ldw4<PF>(w1 + int64_t(kb + u) * 16);
      sw[u][0] = lds8(s0 + kb + u);
      sw[u][1] = lds8(s1 + kb + u);
    }
  }
}

template <int U>
__device__ __forceinline__ void fp4_math(const uint32_t (&a)[U][2], const uint32_t (&sw)[U][2], int kb, int kend, int c_lo, const uint8_t* xt, int g,
                                         int t, const float* xsc, float (&acc)[2]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (kb + u < kend) {
      const int lb = kb + u - c_lo;
      const uint32_t af[4] = {e2m1_lo_e4m3(a[u][0]), e2m1_lo_e4m3(a[u][1]), e2m1_hi_e4m3(a[u][0]), e2m1_hi_e4m3(a[u][1])};
      uint32_t b0 = 0, b1 = 0;
      if (g == 0) {
        b0 = *reinterpret_cast<const uint32_t*>(xt + lb * 32 + 4 * t);
        b1 = *reinterpret_cast<const uint32_t*>(xt + lb * 32 + 16 + 4 * t);
      }
      float d[4];
      mma_e4m3(af, b0, b1, d);
      const float sx = xsc[lb];
      acc[0] = __fmaf_rn(__fmul_rn(d[0], 64.0f), __fmul_rn(dev::e8m0_val(uint8_t(sw[u][0])), sx), acc[0]);
      acc[1] = __fmaf_rn(__fmul_rn(d[2], 64.0f), __fmul_rn(dev::e8m0_val(uint8_t(sw[u][1])), sx), acc[1]);
    }
  }
}

// grid (expert rows, tiles = stripes x P); cluster (1, P).
template <int U, bool PF>
__global__ void __launch_bounds__(kThreads) rg_fp4_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t x_div, RgPart pa,
                                                        RgPart pb, int K, int P, int64_t w_stride, int64_t s_stride,
                                                        const int32_t* __restrict__ expert) {
  pdl_trigger();
  extern __shared__ __align__(16) uint8_t smem[];
  const int KB = K / 32, cmax = (KB + P - 1) / P;
  uint8_t* xt = smem;                                             // [cmax][32] codes: per block 16 even, 16 odd
  float* xsc = reinterpret_cast<float*>(smem + cmax * 32);        // [cmax]
  float4* red = reinterpret_cast<float4*>(xsc + ((cmax + 3) & ~3));  // [kWarps][32]
  float4* part = red + kWarps * 32;                               // [32]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int64_t m = blockIdx.x, tile = blockIdx.y, sa = pa.stripes * P;
  const bool second = tile >= sa;
  const int64_t bt = second ? tile - sa : tile;
  const int rank = int(bt % P);
  const int64_t N = second ? pb.N : pa.N, n0 = (bt / P) * kStripe;
  const uint8_t* W = second ? pb.W : pa.W;
  const uint8_t* S = second ? pb.S : pa.S;
  uint16_t* y = second ? pb.y : pa.y;
  const int c_lo = int(int64_t(KB) * rank / P), c_hi = int(int64_t(KB) * (rank + 1) / P), nc = c_hi - c_lo;
  const int w_lo = c_lo + nc * warp / kWarps, w_hi = c_lo + nc * (warp + 1) / kWarps;

  pdl_wait();  // the expert ids come from the step
  const int64_t e = expert ? expert[m] : 0;
  if (e < 0) return;  // a skipped row: every CTA of the cluster has this row, all return
  W += e * w_stride;
  S += e * s_stride;
  const int64_t r0 = row_at(n0 + g, N), r1 = row_at(n0 + g + 8, N);
  const uint8_t* w0 = W + r0 * (K / 2) + 4 * t;
  const uint8_t* w1 = W + r1 * (K / 2) + 4 * t;
  const uint8_t* s0 = S + r0 * KB;
  const uint8_t* s1 = S + r1 * KB;
  uint32_t a0[U][2], a1[U][2], sw0[U][2], sw1[U][2];
  int kb = w_lo;
  fp4_load<U, PF>(a0, sw0, w0, w1, s0, s1, kb, w_hi);
  {  // the row's codes of the rank's range, per block [even codes][odd codes], and its scales
    const int64_t xm = m / x_div;
    for (int b = tid; b < nc; b += kThreads) {
      const uint4* src = reinterpret_cast<const uint4*>(xc + xm * K + int64_t(c_lo + b) * 32);
      const uint4 lo = src[0], hi = src[1];
      const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      uint32_t ev[4], od[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        ev[q] = __byte_perm(w[2 * q], w[2 * q + 1], 0x6420);
        od[q] = __byte_perm(w[2 * q], w[2 * q + 1], 0x7531);
      }
      *reinterpret_cast<uint4*>(xt + b * 32) = make_uint4(ev[0], ev[1], ev[2], ev[3]);
      *reinterpret_cast<uint4*>(xt + b * 32 + 16) = make_uint4(od[0], od[1], od[2], od[3]);
      xsc[b] = xs[xm * KB + c_lo + b];
    }
    __syncthreads();
  }
  float acc[2] = {0.0f, 0.0f};
  while (kb < w_hi) {
    fp4_load<U, PF>(a1, sw1, w0, w1, s0, s1, kb + U, w_hi);
    fp4_math<U>(a0, sw0, kb, w_hi, c_lo, xt, g, t, xsc, acc);
    kb += U;
    if (kb >= w_hi) break;
    fp4_load<U, PF>(a0, sw0, w0, w1, s0, s1, kb + U, w_hi);
    fp4_math<U>(a1, sw1, kb, w_hi, c_lo, xt, g, t, xsc, acc);
    kb += U;
  }
  const float acc4[4] = {acc[0], 0.0f, acc[1], 0.0f};
  float4 v;
  if (fold(acc4, red, part, P, warp, lane, &v) && t == 0) {
    const int64_t na = n0 + g, nb8 = n0 + g + 8;
    if (na < N) y[m * N + na] = to_bf(v.x);
    if (nb8 < N) y[m * N + nb8] = to_bf(v.z);
  }
  if (P > 1) cg::this_cluster().sync();
}

std::atomic<bool> g_prefetch{true};
std::atomic<int> g_batch[2] = {kFp8U, kFp4U};  // blocks per batch, FP8 / MXFP4 (4 or 8)

int ranks_for(int64_t K, bool fp4) {
  const int64_t cap = fp4 ? kFp4RankMax : kFp8RankMax;
  return int(std::clamp<int64_t>((K + cap - 1) / cap, 1, kMaxRanks));
}

template <typename Kernel, typename... Args>
Status launch(Kernel kernel, int64_t gx, int64_t gy, int P, size_t smem, cudaStream_t st, Args... args) {
  FB_CHECK(gx < (int64_t(1) << 31) && gy <= 65535) << "reg gemv grid " << gx << " x " << gy;
  FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem));
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
  if (P > 1) {
    attr[na].id = cudaLaunchAttributeClusterDimension;
    attr[na].val.clusterDim.x = 1;
    attr[na].val.clusterDim.y = unsigned(P);
    attr[na].val.clusterDim.z = 1;
    ++na;
  }
  cfg.attrs = na ? attr : nullptr;
  cfg.numAttrs = unsigned(na);
  FB_CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, args...));
  FB_CUDA_LAUNCHED("reg_gemv_kernel");
  return Status();
}

}  // namespace

void reg_gemv_set_prefetch(bool on) { g_prefetch.store(on, std::memory_order_relaxed); }
void reg_gemv_set_batch(int fp8_u, int fp4_u) {
  g_batch[0].store(fp8_u == 4 || fp8_u == 8 ? fp8_u : kFp8U, std::memory_order_relaxed);
  g_batch[1].store(fp4_u == 4 || fp4_u == 8 ? fp4_u : kFp4U, std::memory_order_relaxed);
}

Status reg_fp8_gemv(const QuantBuf& q, int64_t M, const Fp8W& wa, uint16_t* ya, const Fp8W* wb, uint16_t* yb, cudaStream_t st) {
  const int64_t K = wa.K, KB = K / 32;
  const int P = ranks_for(K, false), cmax = int((KB + P - 1) / P);
  const RgPart pa{wa.w, wa.s, wa.N, (wa.N + kStripe - 1) / kStripe, ya};
  const RgPart pb = wb ? RgPart{wb->w, wb->s, wb->N, (wb->N + kStripe - 1) / kStripe, yb} : RgPart{};
  const size_t smem = size_t(kRowGroup) * (cmax * 32 + kXPad) + size_t(cmax) * kRowGroup * 4 + (kWarps + 1) * 32 * 16;
  const int64_t gx = (M + kRowGroup - 1) / kRowGroup, gy = (pa.stripes + pb.stripes) * P;
  const uint8_t* codes = q.codes;
  const float* scales = q.scales;
  const bool pf = g_prefetch.load(std::memory_order_relaxed), u8 = g_batch[0].load(std::memory_order_relaxed) == 8;
  const auto kernel = pf ? (u8 ? &rg_fp8_kernel<8, true> : &rg_fp8_kernel<4, true>) : (u8 ? &rg_fp8_kernel<8, false> : &rg_fp8_kernel<4, false>);
  return launch(kernel, gx, gy, P, smem, st, codes, scales, M, pa, pb, int(K), P);
}

Status reg_fp4_gemv(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, uint16_t* ya, const Fp4W* wb, uint16_t* yb, const int32_t* expert,
                    cudaStream_t st) {
  const int64_t K = wa.K, KB = K / 32;
  const int P = ranks_for(K, true), cmax = int((KB + P - 1) / P);
  const RgPart pa{wa.w, wa.s, wa.N, (wa.N + kStripe - 1) / kStripe, ya};
  const RgPart pb = wb ? RgPart{wb->w, wb->s, wb->N, (wb->N + kStripe - 1) / kStripe, yb} : RgPart{};
  const size_t smem = size_t(cmax) * 32 + size_t((cmax + 3) & ~3) * 4 + (kWarps + 1) * 32 * 16;
  const int64_t gy = (pa.stripes + pb.stripes) * P;
  const uint8_t* codes = q.codes;
  const float* scales = q.scales;
  const bool pf = g_prefetch.load(std::memory_order_relaxed), u8 = g_batch[1].load(std::memory_order_relaxed) == 8;
  const auto kernel = pf ? (u8 ? &rg_fp4_kernel<8, true> : &rg_fp4_kernel<4, true>) : (u8 ? &rg_fp4_kernel<8, false> : &rg_fp4_kernel<4, false>);
  return launch(kernel, M, gy, P, smem, st, codes, scales, x_div, pa, pb, int(K), P, wa.w_stride, wa.s_stride, expert);
}

}  // namespace fb::cuda
