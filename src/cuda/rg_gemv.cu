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
__host__ __device__ __forceinline__ int rg_xrow(int iters) { return iters * kStep + 32; }
__host__ __device__ __forceinline__ int rg_warp_bytes(int iters, int xr) { return xr * rg_xrow(iters) + xr * iters * 4 * 4; }

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
  const int xrow = rg_xrow(iters), kb_begin = s_begin * 4, kb_n = min(KB, s_end * 4) - kb_begin;
  uint8_t* xw = smem + warp * rg_warp_bytes(iters, xr);
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
  {
    const int units = kb_n * 2;  // 16-byte units per row
    for (int u = lane; u < rows * units; u += 32) {
      const int r = u / units, q = u - r * units;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_u32(xw + r * xrow + q * 16)),
                   "l"(xc + (m0 + r) * int64_t(K) + kb_begin * 32 + q * 16)
                   : "memory");
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
    for (int u = lane; u < rows * kb_n; u += 32) {
      const int r = u / kb_n, b = u - r * kb_n;
      sxw[r * iters * 4 + b] = xs[(m0 + r) * int64_t(KB) + kb_begin + b];
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncwarp();
  }
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
  float4* red = reinterpret_cast<float4*>(smem + nk * rg_warp_bytes(iters, xr));
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

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void set_fast_gemv_rg(bool on) { g_rg.store(on, std::memory_order_relaxed); }
bool fast_gemv_rg() { return g_rg.load(std::memory_order_relaxed); }

void rg_gemv_set_iters(int iters) { g_iters.store(iters > 0 ? iters : kDefaultIters); }

RgChunks rg_chunks(int64_t K) {
  const int64_t steps = (K + kStep - 1) / kStep, target = g_iters.load();
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
  const size_t smem = size_t(ch.nk) * (rg_warp_bytes(ch.iters, xr) + 32 * 16);
  const dim3 grid{unsigned(groups), unsigned(tiles)}, block{unsigned(32 * ch.nk)};
  const auto kernel = g_depth.load(std::memory_order_relaxed) == 3 ? rg_fp8_kernel<3> : rg_fp8_kernel<2>;
  FB_RETURN_IF_ERROR(allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem));
  FB_CUDA_TRY(launch_pdl(fast_pdl(), kernel, grid, block, smem, st, static_cast<const uint8_t*>(q.codes), static_cast<const float*>(q.scales), M, pa,
                         pb, int(wa.K), ch.iters, xr));
  FB_CUDA_LAUNCHED("rg_fp8_kernel");
  return Status();
}

void rg_gemv_set_depth(int depth) { g_depth.store(depth == 3 ? 3 : kDefaultDepth); }

}  // namespace fb::cuda
