// Register-streamed decode GEMVs [fast] (issue 19): an experiment beside the tile kernels of
// tc_gemv.h, for the micro-benchmark first (FastGemv.RsBench) and the executor only if it wins.
//
// Why: the tile kernels stream the decode weights at 1.5-1.7 TB/s (a CTA copies its whole tile,
// waits, computes, folds, so a wave's copy and compute phases take turns; ~100 instructions per
// 512 MXFP4 bytes). Here the weights are re-laid once (rs_layout.h) so that each lane's 16-byte
// load is exactly its mma.m16n8k16 A fragments: warps stream their K range with D steps of loads
// in flight in registers, decode in registers (FP8: one cvt per pair; MXFP4: 9 integer ops per 8
// codes, no conversion instruction) and run f16 HMMAs; no shared memory holds weights, so every
// warp keeps loading while it computes.
//
// Semantics as the tile kernels' (fast class): the same operands (act_quant e4m3 codes and power-
// of-two scales per 32; FP8 weights with e8m0 scales per 32 x 32, MXFP4 with e8m0 per row and 32),
// each 32-block's mma sum scaled by weight scale x activation scale into f32 (FMA), a CTA's warps
// folded in warp order, one RNE rounding to bf16. The warps per CTA are a function of (N, K) only
// (rs_warps), so every sum's order is: deterministic and row-invariant (a row's output column of
// the mma depends on its own B column only). FastGemv.Rs* test it against the exact kernels (H200,
// session 22).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "cuda/device.h"
#include "cuda/ops.h"

namespace fb::cuda {

// A weight re-laid for these kernels (device memory owned).
struct RsWeight {
  DeviceBuffer w;            // units (rs_layout.h), expert-major
  DeviceBuffer s;            // MXFP4: re-laid scales (32 bytes a unit); FP8: unused (the checkpoint's scales are read in place)
  DeviceBuffer special;      // MXFP4: a byte per expert, 1 when any of its scales is e8m0 0 or 255 (the exact conversion is used)
  const uint8_t* s8 = nullptr;  // FP8: the checkpoint's e8m0 scales [ceil(N / 32), K / 32] (not owned)
  int64_t N = 0, K = 0;
  int experts = 1;
  bool fp4 = false;
};

// Re-lays an FP8 weight (N % 16 == 0, K % 64 == 0; kUnsupported otherwise). The scales stay where
// they are: `w.s` must outlive the result.
Status rs_pack_fp8(const Fp8W& w, RsWeight* out, cudaStream_t st);
// Re-lays `experts` experts of an MXFP4 weight (w_stride / s_stride between experts).
Status rs_pack_fp4(const Fp4W& w, int experts, RsWeight* out, cudaStream_t st);

// y [M, N] = q . w^T for M <= 8 rows per CTA group (rows beyond 8 in further CTA groups).
Status rs_fp8_gemv(const QuantBuf& q, int64_t M, const RsWeight& w, uint16_t* y, cudaStream_t st, bool pdl = true);
// Two weights of one K over the same rows in one launch (wq_a + wkv, shared w1 + w3): each output
// bit-identical to rs_fp8_gemv's (each weight keeps its own warps per CTA).
Status rs_fp8_gemv2(const QuantBuf& q, int64_t M, const RsWeight& wa, uint16_t* ya, const RsWeight* wb, uint16_t* yb, cudaStream_t st,
                    bool pdl = true);
// Experts (tc_fp4_gemv's semantics): row m reads activation row m / x_div and expert expert[m]
// (nullptr: 0; < 0: skipped, y untouched) of wa, and of wb into yb when wb != nullptr. group_rows
// (with expert ids and 2..64 rows): the rows that chose one expert share its weight reads, up to 4
// (or 8: rs_set_group_rows) a CTA as the mma's columns; each row's bits are the ungrouped launch's.
Status rs_fp4_gemv(const QuantBuf& q, int64_t M, int64_t x_div, const RsWeight& wa, uint16_t* ya, const RsWeight* wb, uint16_t* yb,
                   const int32_t* expert, cudaStream_t st, bool pdl = true, bool group_rows = false);

// Warps per CTA (each takes a contiguous range of the K steps; the CTA folds them in order):
// a function of (N, K) only. Bench knobs (process-wide; they change the bits, never the
// guarantees): the warps a launch of one activation row aims at (FP8, MXFP4 per expert row) and
// the steps of loads in flight per warp (2, 4 or 8). <= 0 restores the defaults.
int rs_warps(int64_t N, int64_t K, bool fp4);
void rs_set_tuning(int fp8_target_warps, int fp4_target_warps, int depth);
// Rows per group of an MXFP4 launch grouped by expert: 4 (default) or 8 (process-wide; the bits
// never change, only the weight reads per row and the CTAs per SM).
void rs_set_group_rows(int g);
// CTAs per stripe of a grouped MXFP4 launch, 1..64 (each computes every Y-th group; others
// restore the default 8). The bits never change.
void rs_set_group_ctas(int y);
// Grouped MXFP4 rows of at most 8 tokens' activations (x_div > 1): the tokens' rows staged once per
// CTA for all its groups (on, the default) or each group's rows staged for it. The same bits.
void rs_set_token_staging(bool on);

// The executor's A/B (CudaRunOptions::rs_gemv, off by default; fast_gemv.h routes its FP8 calls of
// at most 64 rows and its MXFP4 calls of registered experts here while on, grouped or not, so a
// row's bits never depend on the step's other rows): packed copies made on first use,
// kept per weight (its code pointer). An MXFP4 weight qualifies only once registered with its
// expert count: the executor registers its resident experts; the tiered layers' slots and
// staging buffers change contents between calls and are never registered (their calls stay on
// the tiles). rs_clear_packed() frees every copy and registration (the executor's destructor: a
// later allocation at the same address must not find a stale copy).
// mode: 0 off; 1 the FP8 calls and the registered MXFP4 experts; 2 the FP8 calls only (every MXFP4
// call on the tiles). Each weight kind takes one path for every row count, so either mode keeps
// rows invariant.
void set_fast_gemv_rs(int mode);
bool fast_gemv_rs();      // FP8 calls of <= 64 rows go here
bool fast_gemv_rs_fp4();  // registered MXFP4 experts go here
void rs_register_experts(const uint8_t* w, int experts);
// nullptr: not packable (shape) or, MXFP4, not registered.
Result<const RsWeight*> rs_packed_fp8(const Fp8W& w, cudaStream_t st);
Result<const RsWeight*> rs_packed_fp4(const Fp4W& w, cudaStream_t st);
void rs_clear_packed();

// Micro-benchmark (fast_gemv_bench.cu; FastGemv.RsBench): rs vs the tiles at the released decode
// shapes, then the knobs. Prints; never fails on speed.
Status rs_gemv_bench();

}  // namespace fb::cuda
