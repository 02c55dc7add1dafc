// Tensor-core fast GEMVs ([fast], fast_gemv.h): the block-scaled FP8 and MXFP4 decode GEMVs as
// one mma.m16n8k32 (e4m3 x e4m3 -> f32) per 16 outputs x 32-element block, the block's two power-
// of-two scales applied to the mma's f32 result with one FMA into the output's f32 accumulator.
//
// Why: on CUDA cores each weight byte costs a conversion and a multiply-add per row; the FP8 and
// MXFP4 GEMVs then run at 0.8-1.5 TB/s, bound by instructions, not HBM (fast_gemv.cu measured it).
// One mma consumes 512 weight bytes (FP8; 256 for MXFP4, widened exactly to e4m3 with two byte
// permutes) for up to 8 activation rows, so a lane spends a handful of instructions per 16 bytes.
//
// Layout trick: a 32-element block's dot product does not depend on which k slot of the mma holds
// which element, so the same permutation on the weight (A) and activation (B) operands lets every
// lane load CONTIGUOUS bytes: lane (g = lane / 4, t = lane % 4) holds bytes [8t, 8t + 8) of the
// block for weight rows g and g + 8 (A) and for activation row g (B).
//
// Numerics: the products are exact (e4m3 x e4m3, and e2m1 is a subset of e4m3); the sum of a
// block's 32 products is the tensor core's f32 sum; blocks are added in increasing order per warp,
// then the warps of a K split in warp order. The split depends only on the weight shape (N, K),
// and a column's mma result depends only on its own operands, so the bits of an output row never
// depend on M or on the other rows (row invariance), and every run gives the same bits.
#include <atomic>

#include "cuda/device.h"
#include "cuda/fast_gemv.h"
#include "cuda/numerics.cuh"

namespace fb::cuda {

namespace {

std::atomic<bool> g_fast_mma{true};

constexpr int kTile = 16;   // outputs per mma tile (the m of m16n8k32)
constexpr int kCols = 8;    // activation rows per mma (the n)
constexpr int kUnroll = 8;  // blocks whose loads a warp issues before its first mma (4 KB FP8)
// Warps that should stream a weight to cover HBM latency (~4 KB in flight each, ~10 per SM).
constexpr int64_t kWantWarps = 1536;
constexpr int kMaxSplit = 16;

__device__ __forceinline__ uint2 ld_stream8(const uint8_t* p) {
  uint2 v;
  asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_stream4(const uint8_t* p) {
  uint32_t v;
  asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f), "f"(0.0f), "f"(0.0f), "f"(0.0f));
}

// Four e2m1 codes (nibbles of the low 16 bits of v, element order) -> four e4m3 bytes, exact:
// magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6} are e4m3 {00, 30, 38, 3C, 40, 44, 48, 4C}; sign to bit 7.
__device__ __forceinline__ uint32_t e2m1x4_to_e4m3(uint32_t v) {
  const uint32_t mag = __byte_perm(0x3C383000u, 0x4C484440u, v & 0x7777u);
  const uint32_t sgn = ((v & 0x8u) << 4) | ((v & 0x80u) << 8) | ((v & 0x800u) << 12) | ((v & 0x8000u) << 16);
  return mag | sgn;
}

// K split of a weight of N outputs and nb 32-blocks: a power of two, from the shape alone.
int split_for(int64_t N, int64_t nb) {
  const int64_t tiles = N / kTile;
  int s = 1;
  while (s < kMaxSplit && tiles * s < kWantWarps && int64_t(s) * 2 <= nb) s *= 2;
  return s;
}

// Warp w of the split takes blocks [b0, b1) of its tile; returns the four partial sums of lane
// (g, t): outputs (row g, cols 2t, 2t+1) and (row g + 8, cols 2t, 2t+1).
template <bool kFp4>
struct Operands {
  const uint8_t* w_row0;  // weight row n0 + g at block 0 (byte offset of this lane's slice included)
  const uint8_t* w_row1;  // weight row n0 + g + 8
  const uint8_t* ws0;     // e8m0 scales of row block (FP8: the 32-row block; FP4: row n0 + g)
  const uint8_t* ws1;     // FP4: row n0 + g + 8 (FP8: = ws0)
  const uint8_t* x_row;   // activation codes of B's column g at block 0 (this lane's slice); null: zero column
  const float* xs0;       // scales of the columns 2t and 2t + 1 (null: padding column)
  const float* xs1;
};

template <bool kFp4>
__device__ __forceinline__ void block_range(const Operands<kFp4>& o, int64_t b0, int64_t b1, float (&acc)[4]) {
  constexpr int64_t kBlockBytes = kFp4 ? 16 : 32;
  for (int64_t b = b0; b < b1; b += kUnroll) {
    uint32_t a[kUnroll][4], xb[kUnroll][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (b + u >= b1) break;
      const int64_t off = (b + u) * kBlockBytes;
      if constexpr (kFp4) {
        const uint32_t r0 = ld_stream4(o.w_row0 + off), r1 = ld_stream4(o.w_row1 + off);
        a[u][0] = e2m1x4_to_e4m3(r0);
        a[u][2] = e2m1x4_to_e4m3(r0 >> 16);
        a[u][1] = e2m1x4_to_e4m3(r1);
        a[u][3] = e2m1x4_to_e4m3(r1 >> 16);
      } else {
        const uint2 r0 = ld_stream8(o.w_row0 + off), r1 = ld_stream8(o.w_row1 + off);
        a[u][0] = r0.x;
        a[u][2] = r0.y;
        a[u][1] = r1.x;
        a[u][3] = r1.y;
      }
      if (o.x_row) {
        const uint2 xv = __ldg(reinterpret_cast<const uint2*>(o.x_row + (b + u) * 32));
        xb[u][0] = xv.x;
        xb[u][1] = xv.y;
      } else {
        xb[u][0] = xb[u][1] = 0;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (b + u >= b1) break;
      float d[4];
      mma_e4m3(d, a[u][0], a[u][1], a[u][2], a[u][3], xb[u][0], xb[u][1]);
      const float sw0 = dev::e8m0_val(o.ws0[b + u]), sw1 = kFp4 ? dev::e8m0_val(o.ws1[b + u]) : sw0;
      const float sx0 = o.xs0 ? o.xs0[b + u] : 0.0f, sx1 = o.xs1 ? o.xs1[b + u] : 0.0f;
      acc[0] = __fmaf_rn(d[0], sw0 * sx0, acc[0]);
      acc[1] = __fmaf_rn(d[1], sw0 * sx1, acc[1]);
      acc[2] = __fmaf_rn(d[2], sw1 * sx0, acc[2]);
      acc[3] = __fmaf_rn(d[3], sw1 * sx1, acc[3]);
    }
  }
}

// Sum of the split's warps in warp order; warp 0 lanes get the totals.
__device__ __forceinline__ void reduce_split(float (&acc)[4], float* part, int split) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (split == 1) return;
  for (int i = 0; i < 4; ++i) part[(warp * 32 + lane) * 4 + i] = acc[i];
  __syncthreads();
  if (warp == 0)
    for (int i = 0; i < 4; ++i) {
      float s = part[lane * 4 + i];
      for (int w = 1; w < split; ++w) s += part[(w * 32 + lane) * 4 + i];
      acc[i] = s;
    }
}

// FP8: grid (N / 16, ceil(M / 8)), split warps per CTA; CTA y covers activation rows 8y .. 8y + 7.
__global__ void __launch_bounds__(32 * kMaxSplit) mma_fp8_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t M,
                                                                  const uint8_t* __restrict__ W, const uint8_t* __restrict__ S, int64_t N,
                                                                  int64_t K, int split, uint16_t* __restrict__ y) {
  __shared__ float part[kMaxSplit * 32 * 4];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t nb = K / 32, n0 = int64_t(blockIdx.x) * kTile, m_base = int64_t(blockIdx.y) * kCols;
  const int64_t mb = m_base + g, mc0 = m_base + 2 * t, mc1 = mc0 + 1;
  Operands<false> o;
  o.w_row0 = W + (n0 + g) * K + 8 * t;
  o.w_row1 = o.w_row0 + 8 * K;
  o.ws0 = o.ws1 = S + (n0 / 32) * nb;
  o.x_row = mb < M ? xc + mb * K + 8 * t : nullptr;
  o.xs0 = mc0 < M ? xs + mc0 * nb : nullptr;
  o.xs1 = mc1 < M ? xs + mc1 * nb : nullptr;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  block_range(o, warp * nb / split, (warp + 1) * nb / split, acc);
  reduce_split(acc, part, split);
  if (warp != 0) return;
  if (mc0 < M) {
    y[mc0 * N + n0 + g] = dev::to_bf(acc[0]);
    y[mc0 * N + n0 + g + 8] = dev::to_bf(acc[2]);
  }
  if (mc1 < M) {
    y[mc1 * N + n0 + g] = dev::to_bf(acc[1]);
    y[mc1 * N + n0 + g + 8] = dev::to_bf(acc[3]);
  }
}

// MXFP4 experts: grid (N / 16, M, 1 or 2 weights); one activation row per CTA (its own expert), in
// B's column 0; the other seven columns are zero.
__global__ void __launch_bounds__(32 * kMaxSplit) mma_fp4_kernel(const uint8_t* __restrict__ xc, const float* __restrict__ xs, int64_t x_div,
                                                                  Fp4W wa, Fp4W wb, const int32_t* __restrict__ expert, int split,
                                                                  uint16_t* __restrict__ ya, uint16_t* __restrict__ yb) {
  __shared__ float part[kMaxSplit * 32 * 4];
  const Fp4W& w = blockIdx.z == 0 ? wa : wb;
  uint16_t* y = blockIdx.z == 0 ? ya : yb;
  const int64_t m = blockIdx.y;
  const int e = expert ? expert[m] : 0;
  if (e < 0) return;  // a row of another wave: untouched
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t K = w.K, N = w.N, nb = K / 32, n0 = int64_t(blockIdx.x) * kTile, xr = m / x_div;
  Operands<true> o;
  const uint8_t* We = w.w + int64_t(e) * w.w_stride;
  const uint8_t* Se = w.s + int64_t(e) * w.s_stride;
  o.w_row0 = We + (n0 + g) * (K / 2) + 4 * t;
  o.w_row1 = o.w_row0 + 8 * (K / 2);
  o.ws0 = Se + (n0 + g) * nb;
  o.ws1 = Se + (n0 + g + 8) * nb;
  o.x_row = g == 0 ? xc + xr * K + 8 * t : nullptr;
  o.xs0 = t == 0 ? xs + xr * nb : nullptr;
  o.xs1 = nullptr;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  block_range(o, warp * nb / split, (warp + 1) * nb / split, acc);
  reduce_split(acc, part, split);
  if (warp != 0 || t != 0) return;
  y[m * N + n0 + g] = dev::to_bf(acc[0]);
  y[m * N + n0 + g + 8] = dev::to_bf(acc[2]);
}

bool aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; }

}  // namespace

void set_fast_gemv_mma(bool on) { g_fast_mma.store(on, std::memory_order_relaxed); }

bool fast_mma_fp8_ok(const Fp8W& w, const QuantBuf& q) {
  return g_fast_mma.load(std::memory_order_relaxed) && w.N % kTile == 0 && w.K % 32 == 0 && aligned8(w.w) && aligned8(q.codes);
}
bool fast_mma_fp4_ok(const Fp4W& w, const QuantBuf& q) {
  return g_fast_mma.load(std::memory_order_relaxed) && w.N % kTile == 0 && w.K % 32 == 0 && w.w_stride % 4 == 0 &&
         (reinterpret_cast<uintptr_t>(w.w) & 3u) == 0 && aligned8(q.codes);
}

Status mma_fast_fp8_gemv_q(const QuantBuf& q, int64_t M, const Fp8W& w, uint16_t* y, cudaStream_t st) {
  FB_CHECK(fast_mma_fp8_ok(w, q) && M * w.K <= q.capacity) << "mma fast fp8 gemv N=" << w.N << " K=" << w.K << " M=" << M;
  if (M == 0 || w.N == 0) return Status();
  const int split = split_for(w.N, w.K / 32);
  const dim3 grid(unsigned(w.N / kTile), unsigned((M + kCols - 1) / kCols));
  FB_CHECK(grid.y <= 65535 && w.N / kTile <= int64_t(INT32_MAX)) << "mma fast fp8 gemv M=" << M;
  mma_fp8_kernel<<<grid, 32 * split, 0, st>>>(q.codes, q.scales, M, w.w, w.s, w.N, w.K, split, y);
  FB_CUDA_LAUNCHED("mma_fp8_kernel");
  return Status();
}

Status mma_fast_fp4_gemv_q(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, const Fp4W* wb, const int32_t* expert, uint16_t* ya,
                           uint16_t* yb, cudaStream_t st) {
  FB_CHECK(fast_mma_fp4_ok(wa, q) && (!wb || fast_mma_fp4_ok(*wb, q)) && x_div >= 1 && ((M - 1) / x_div + 1) * wa.K <= q.capacity)
      << "mma fast fp4 gemv N=" << wa.N << " K=" << wa.K << " M=" << M;
  if (M == 0 || wa.N == 0) return Status();
  const int split = split_for(wa.N, wa.K / 32);
  const dim3 grid(unsigned(wa.N / kTile), unsigned(M), wb ? 2u : 1u);
  FB_CHECK(M <= 65535) << "mma fast fp4 gemv rows " << M;
  mma_fp4_kernel<<<grid, 32 * split, 0, st>>>(q.codes, q.scales, x_div, wa, wb ? *wb : wa, expert, split, ya, wb ? yb : ya);
  FB_CUDA_LAUNCHED("mma_fp4_kernel");
  return Status();
}

}  // namespace fb::cuda
