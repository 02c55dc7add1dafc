// Device helpers shared by the tensor-core GEMV kernels (tc_gemv.cu: the tile kernels; tc_stream.cu:
// the streaming kernels), and the split-K fold workspace they share per stream. Internal header.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "cuda/ops.h"

namespace fb::cuda::tcdev {

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

// The split-K fold through global memory (tc_global_fold): one 32 x float4 partial per (row or
// row group, stripe, chunk) and one arrival counter per (row or row group, stripe). The CTA that
// arrives last sums the partials in rank order (the cluster fold's order: the same bits) and
// returns the counter to zero for the next launch on the stream. parts == nullptr: the cluster fold.
struct FoldWs {
  float4* parts = nullptr;
  unsigned* counters = nullptr;
};
// The workspace for ids (row [group], stripe) pairs of nk partials each on stream st, or an
// empty one (fold through the cluster, or do not split) when it cannot be had now (tc_gemv.cu).
FoldWs fold_workspace(cudaStream_t st, int64_t ids, int nk);

}  // namespace fb::cuda::tcdev

namespace fb::cuda {
// The streaming kernels (tc_stream.cu) for tc_fp8_gemv / tc_fp4_gemv (ungrouped): *taken says
// whether they ran the launch (set_tc_stream on and a launch they suit); else the tile kernel runs it.
Status tc_fp8_stream(const QuantBuf& q, int64_t M, const Fp8W& wa, uint16_t* ya, const Fp8W* wb, uint16_t* yb, cudaStream_t st, bool* taken);
Status tc_fp4_stream(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, uint16_t* ya, const Fp4W* wb, uint16_t* yb,
                     const int32_t* expert, cudaStream_t st, ExpertPdl pdl, bool* taken);

}  // namespace fb::cuda
