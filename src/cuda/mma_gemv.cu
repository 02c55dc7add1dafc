// Tensor-core GEMVs for decode and verify rows (mma_gemv.h): FP8 mma.m16n8k32 on the raw e4m3
// codes, one 32-element K block per instruction, so each block's dot is formed on the tensor core
// and scaled and summed on the CUDA cores exactly where the CPU scales and sums it.
//
// Fragments (PTX ISA, mma.m16n8k32 with 8-bit operands; g = lane / 4, t = lane % 4):
//   A (16 x 32, rows = activation rows): a0 row g, k 4t..4t+3; a1 row g+8, same k;
//                                        a2 row g, k 16+4t..; a3 row g+8, k 16+4t..
//   B (32 x 8, cols = weight rows):      b0 k 4t..4t+3, col g; b1 k 16+4t.., col g
//   D (16 x 8 f32):                      d0, d1 row g, cols 2t, 2t+1; d2, d3 row g+8
// The order of k inside a block is free (the same permutation on both operands), so lane t takes
// the physical bytes 8t..8t+7 of the block as its logical k 4t..4t+3 and 16+4t..16+4t+3: every
// operand is one contiguous 8-byte load (4 packed bytes for MXFP4).
//
// Row invariance (DSpark's greedy identity): the value of D[r][c] depends only on A row r and B
// column c, the block order per warp and the cross-warp reduction order are fixed, so a row's
// outputs are bit-identical whichever other rows share its instruction (1 decode row or 6 verify
// rows, any grouping).
#include "cuda/mma_gemv.h"

#include "base/check.h"
#include "cuda/device.h"
#include "cuda/numerics.cuh"

namespace fb::cuda {

using namespace dev;

namespace {

constexpr int kWarps = 4;  // warps per CTA, splitting the K blocks (b = warp, warp + 4, ...)
constexpr int kRows = 16;  // activation rows per instruction
constexpr int kCols = 8;   // weight rows (outputs) per CTA
constexpr int kUnroll = 4; // blocks whose loads a warp issues before the first mma

__device__ __forceinline__ void mma_e4m3(const uint32_t (&a)[4], const uint32_t (&b)[2], float (&d)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %11, %12, %13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.0f), "f"(0.0f), "f"(0.0f), "f"(0.0f));
}

// Four e2m1 nibbles (bits 0..15 of w) -> four e4m3 bytes of the same values (all exact):
// magnitudes through a byte permute of the 8-entry table, signs moved from bit 3 to bit 7.
__device__ __forceinline__ uint32_t e2m1x4_to_e4m3x4(uint32_t w) {
  constexpr uint32_t kLo = 0x3C383000u;  // 0, 0.5, 1, 1.5
  constexpr uint32_t kHi = 0x4C484440u;  // 2, 3, 4, 6
  const uint32_t mag = __byte_perm(kLo, kHi, w & 0x7777u);
  const uint32_t s = w & 0x8888u;
  return mag | ((s & 0x0008u) << 4) | ((s & 0x0080u) << 8) | ((s & 0x0800u) << 12) | ((s & 0x8000u) << 16);
}

struct Params {
  const uint8_t* xc;   // act_quant codes [rows, K]
  const float* xs;     // scales [rows, K/32]
  int64_t x_div;       // output row m reads activation row m / x_div
  const uint8_t* w;    // FP8 [N, K] or MXFP4 packed [E][N, K/2]
  const uint8_t* s;    // FP8 e8m0 [ceil(N/32), K/32] or MXFP4 e8m0 [E][N, K/32]
  int64_t w_stride, s_stride;  // MXFP4: bytes between experts
  int64_t N, K;
  MmaGroups groups;    // MXFP4: rows grouped by expert (device arrays); FP8: unused (rows 0..M-1)
  int64_t M;
  uint16_t* y;         // [M, N]
};

template <bool kFp4>
__global__ void __launch_bounds__(32 * kWarps) mma_gemv_kernel(Params p) {
  __shared__ float part[kWarps][kRows][kCols];
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  const int64_t n0 = int64_t(blockIdx.x) * kCols, KB = p.K / 32;
  // This CTA's rows: a slot of the grouping (one expert's rows in ascending order) or all rows.
  int64_t r_begin = 0, r_end = p.M, expert = 0;
  const int32_t* rows = nullptr;
  if (kFp4) {
    const int slot = int(blockIdx.y);
    if (slot >= *p.groups.n_slots) return;  // whole CTA
    expert = p.groups.slot_expert[slot];
    r_begin = p.groups.slot_begin[slot];
    r_end = p.groups.slot_begin[slot + 1];
    rows = p.groups.rows;
  }
  const uint8_t* W = p.w + expert * p.w_stride;
  const uint8_t* S = p.s + expert * p.s_stride;
  const int64_t n = n0 + g;  // this lane's weight row for B
  const bool n_ok = n < p.N;
  for (int64_t c0 = r_begin; c0 < r_end; c0 += kRows) {
    int64_t m[2], xr[2];
    bool ok[2];
    for (int h = 0; h < 2; ++h) {
      const int64_t r = c0 + g + 8 * h;
      ok[h] = r < r_end;
      m[h] = ok[h] ? (rows ? int64_t(rows[r]) : r) : 0;
      xr[h] = m[h] / p.x_div;
    }
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b0 = warp; b0 < KB; b0 += int64_t(kWarps) * kUnroll) {
      uint2 av[kUnroll][2], bv[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t b = b0 + int64_t(u) * kWarps;
        av[u][0] = av[u][1] = make_uint2(0u, 0u);
        bv[u] = make_uint2(0u, 0u);
        if (b >= KB) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (ok[h]) av[u][h] = *reinterpret_cast<const uint2*>(p.xc + xr[h] * p.K + b * 32 + 8 * t);
        if (n_ok) {
          if (kFp4) {
            const uint32_t packed = *reinterpret_cast<const uint32_t*>(W + n * (p.K / 2) + b * 16 + 4 * t);
            bv[u] = make_uint2(e2m1x4_to_e4m3x4(packed & 0xFFFFu), e2m1x4_to_e4m3x4(packed >> 16));
          } else {
            bv[u] = *reinterpret_cast<const uint2*>(W + n * p.K + b * 32 + 8 * t);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t b = b0 + int64_t(u) * kWarps;
        if (b >= KB) break;
        const uint32_t a[4] = {av[u][0].x, av[u][1].x, av[u][0].y, av[u][1].y};
        const uint32_t bb[2] = {bv[u].x, bv[u].y};
        float d[4];
        mma_e4m3(a, bb, d);
        // acc += dot * (x_scale * w_scale): the CPU's blocks16 step for this block.
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int h = i >> 1;
          const int64_t col = n0 + 2 * t + (i & 1);
          if (!ok[h] || col >= p.N) continue;
          const float xsc = p.xs[xr[h] * KB + b];
          const float wsc = kFp4 ? e8m0_val(S[col * KB + b]) : e8m0_val(S[(col / 32) * KB + b]);
          acc[i] = fm::add(acc[i], fm::mul(d[i], fm::mul(xsc, wsc)));
        }
      }
    }
    part[warp][g][2 * t] = acc[0];
    part[warp][g][2 * t + 1] = acc[1];
    part[warp][g + 8][2 * t] = acc[2];
    part[warp][g + 8][2 * t + 1] = acc[3];
    __syncthreads();
    if (threadIdx.x < kRows * kCols) {
      const int r = int(threadIdx.x) / kCols, c = int(threadIdx.x) % kCols;
      const int64_t rr = c0 + r, col = n0 + c;
      if (rr < r_end && col < p.N) {
        float sum = part[0][r][c];
        for (int w = 1; w < kWarps; ++w) sum = fm::add(sum, part[w][r][c]);  // warp order: fixed
        const int64_t mo = rows ? int64_t(rows[rr]) : rr;
        p.y[mo * p.N + col] = to_bf(sum);
      }
    }
    __syncthreads();
  }
}

// One block: rows grouped by expert, experts ascending, rows ascending within an expert.
__global__ void group_rows_kernel(const int32_t* __restrict__ expert, int64_t M, int E, MmaGroups g) {
  extern __shared__ int32_t cnt[];  // [E]
  for (int e = int(threadIdx.x); e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const int e = expert[m];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int slots = 0, at = 0;
    for (int e = 0; e < E; ++e) {
      if (cnt[e] == 0) continue;
      g.slot_expert[slots] = e;
      g.slot_begin[slots] = at;
      at += cnt[e];
      cnt[e] = g.slot_begin[slots];  // now: where the expert's rows start
      ++slots;
    }
    g.slot_begin[slots] = at;
    *g.n_slots = slots;
  }
  __syncthreads();
  // Row m's place: its expert's start plus the rows of that expert before m (ascending order).
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const int e = expert[m];
    if (e < 0 || e >= E) continue;
    int before = 0;
    for (int64_t j = 0; j < m; ++j) before += expert[j] == e;
    g.rows[cnt[e] + before] = int32_t(m);
  }
}

inline bool a8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; }

}  // namespace

int64_t mma_group_ints(int64_t M) { return 1 + M + 2 * (M + 1); }

MmaGroups mma_groups_at(int32_t* scratch, int64_t M) {
  MmaGroups g;
  g.n_slots = scratch;
  g.rows = scratch + 1;
  g.slot_expert = scratch + 1 + M;
  g.slot_begin = scratch + 1 + M + (M + 1);
  return g;
}

bool mma_gemv_ok(int64_t K, const void* x_codes, const void* w, int64_t w_stride, bool fp4) {
  return K % 32 == 0 && a8(x_codes) && (fp4 ? ((reinterpret_cast<uintptr_t>(w) & 3u) == 0 && w_stride % 4 == 0) : a8(w) && K % 8 == 0);
}

Status mma_group_rows(const int32_t* expert, int64_t M, int E, const MmaGroups& g, cudaStream_t st) {
  FB_CHECK(E > 0 && E <= 4096 && M >= 0);
  group_rows_kernel<<<1, 256, size_t(E) * sizeof(int32_t), st>>>(expert, M, E, g);
  FB_CUDA_LAUNCHED("mma_group_rows_kernel");
  return Status();
}

Status mma_fp8_gemm_q(const QuantBuf& q, int64_t M, const Fp8W& w, uint16_t* y, cudaStream_t st) {
  FB_CHECK(mma_gemv_ok(w.K, q.codes, w.w, 0, false)) << "mma fp8 gemv K=" << w.K;
  if (M == 0 || w.N == 0) return Status();
  Params p{q.codes, q.scales, 1, w.w, w.s, 0, 0, w.N, w.K, MmaGroups{}, M, y};
  mma_gemv_kernel<false><<<dim3(unsigned((w.N + kCols - 1) / kCols), 1), 32 * kWarps, 0, st>>>(p);
  FB_CUDA_LAUNCHED("mma_gemv_kernel<fp8>");
  return Status();
}

Status mma_fp4_gemm_q(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& w, const MmaGroups& groups, int64_t max_slots, uint16_t* y,
                      cudaStream_t st) {
  FB_CHECK(x_div >= 1 && mma_gemv_ok(w.K, q.codes, w.w, w.w_stride, true)) << "mma fp4 gemv K=" << w.K;
  if (M == 0 || w.N == 0 || max_slots == 0) return Status();
  Params p{q.codes, q.scales, x_div, w.w, w.s, w.w_stride, w.s_stride, w.N, w.K, groups, M, y};
  mma_gemv_kernel<true><<<dim3(unsigned((w.N + kCols - 1) / kCols), unsigned(max_slots)), 32 * kWarps, 0, st>>>(p);
  FB_CUDA_LAUNCHED("mma_gemv_kernel<fp4>");
  return Status();
}

}  // namespace fb::cuda
