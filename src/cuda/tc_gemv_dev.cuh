// Device pieces shared by the tensor-core decode GEMVs (tc_gemv.cu: one tile per CTA, combined
// through a cluster; tc_stream.cu: persistent CTAs streaming tiles through a two-stage pipeline):
// tile geometry, cp.async / ldmatrix / mma wrappers and the e2m1 / e4m3 widenings.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "cuda/tc_gemv.h"

namespace fb::cuda::tcdev {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kStripe = 16;                            // output rows per CTA (the mma's m)
constexpr int kRowGroup = 8;                           // FP8 activation rows per CTA (the mma's n)
// k per chunk: 32 KB of weight tile (micro-bench on the H200, tc_gemv_set_chunk_max sweep 512/1024/
// 2048 for FP8 and 1024/2048/4096 for MXFP4 at the released decode shapes: the largest was fastest
// or equal for every shape, e.g. wq_b 1.30 / 1.73 / 2.32 TB/s with PDL)
constexpr int kFp8ChunkMax = 2048, kFp4ChunkMax = 4096;
constexpr int kMaxChunks = 8;                          // the portable cluster size

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
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

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

// Byte offset of 16-byte unit j of tile row r (row bytes rb, a multiple of 128).
__device__ __forceinline__ int tile_off(int r, int j, int rb) { return r * rb + (((j & ~7) | ((j ^ r) & 7)) << 4); }

}  // namespace fb::cuda::tcdev

namespace fb::cuda {

// One call of the streaming kernels (tc_stream.cu), as tc_gemv.cu's launcher sees it.
struct TcStreamCall {
  const uint8_t* xc = nullptr;  // activation codes (FP8 / MXFP4)
  const float* xs = nullptr;    // their scales
  int64_t M = 0, x_div = 1;
  tcdev::TcPart pa, pb;
  int64_t K = 0;
  TcChunks ch;
  int64_t w_stride = 0, s_stride = 0;  // MXFP4: per expert
  const int32_t* expert = nullptr;
  tcdev::BfxArgs bfx;
};
// Whether the call suits the streaming kernel (set_tc_stream on, K % 128 == 0, 4-byte aligned
// scale rows); tc_stream_launch then computes what tc_gemv.cu's kernel would, bit for bit, or
// returns false having launched nothing (no unit counters could be had: a first call inside a
// stream capture).
bool tc_stream_fits(const TcStreamCall& c);
Result<bool> tc_stream_launch(int mode, const TcStreamCall& c, cudaStream_t st);

}  // namespace fb::cuda
