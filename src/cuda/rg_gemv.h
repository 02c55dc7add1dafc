// Register-streaming tensor-core decode GEMVs of the fast class [fast]: the block-scaled FP8 (and
// MXFP4 expert) GEMVs of fast_gemv.h with the same operands, semantics and guarantees
// (deterministic, row-invariant, NMSE far below 1e-5 against the exact kernels), built so a
// warp's weight bytes go straight from HBM into the registers its mma reads, with no shared-memory
// tile: a CTA holds no shared memory through its life (a small fold buffer at the end), so CTAs of
// the next GEMV fit beside the tail of the current one, and every warp issues its first weight
// loads before griddepcontrol.wait (the weights never depend on the step).
//
//  * Layout, with no re-laying of the checkpoint's row-major [N, K] codes: a warp owns a stripe of
//    16 output rows and a range of K. Lane (g, t) of the mma fragment (g = lane / 4 the row,
//    t = lane % 4) loads 16 contiguous bytes of rows g and g + 8 at byte 16t of every 64-byte
//    slab, so a warp instruction reads 8 rows x 64 contiguous bytes.
//  * The mma's k split across a quad must stay inside one 32-element scale block. FP8: a slab is
//    two blocks and lane t holds half of block t / 2; one exchange with lane t ^ 2 (two shuffles
//    per row and slab) leaves every lane 8 bytes of each block (block-relative byte 16 (t & 1) +
//    8 (t >> 1)). The activation codes are loaded at the same block-relative bytes, so A and B
//    agree on a permutation of k inside the block (a sum over the same products).
//  * Per 32-block: two mma.m16n8k16 on the f16 widening of both e4m3 operands (exact), from zero,
//    then acc += d * (weight scale * activation scale) (FMA; e8m0 scales are powers of two).
//  * CTA = nk warps over one stripe and one group of 8 activation rows (the mma's n); warp w
//    takes chunk w of K (nk and the chunk from K alone); the warps' partials add in warp order in
//    shared memory, one RNE rounding to bf16. Every sum's order is a function of K only: the same
//    bits for a row whatever M, the pair partner or the other rows are.
// Host header; fast_gemv.h routes its FP8 calls here when set_fast_gemv_rg(true) (and tc on).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "cuda/ops.h"

namespace fb::cuda {

// ya = q . wa^T [M, wa.N] and, when wb != nullptr, yb = q . wb^T (wb->K == wa.K) in one launch.
// K % 32 == 0, 16-byte aligned weights and codes (weight rows of K bytes: K % 16 == 0).
Status rg_fp8_gemv(const QuantBuf& q, int64_t M, const Fp8W& wa, uint16_t* ya, const Fp8W* wb, uint16_t* yb, cudaStream_t st);

// Experts (fast_gemv.h fast_fp4_gemv_q's semantics): row m reads activation row m / x_div and
// expert expert[m] (nullptr: 0; < 0: skipped, y untouched) of wa (and of wb into yb when wb !=
// nullptr; same shape and strides). The 16-byte slab slice of a lane is one 32-block; a 4 x 4
// word transpose in the quad gives every lane 8 elements of each of the slab's four blocks.
// group_rows (1 < M <= 64): rows that chose the same expert share its reads as the mma's columns
// (up to 8; the same bits). pdl: ExpertPdl (ops.h). K % 32 == 0, (K / 2) % 16 == 0.
Status rg_fp4_gemv(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, uint16_t* ya, const Fp4W* wb, uint16_t* yb, const int32_t* expert,
                   cudaStream_t st, bool group_rows = false, ExpertPdl pdl = ExpertPdl::kPlain);

// The split of a weight row of row_bytes (FP8: K, MXFP4: K / 2; exposed for tests): nk warps per
// CTA, each over `iters` 128-byte steps of the row (the last warp's range may be shorter).
struct RgChunks {
  int nk = 1;
  int iters = 1;
};
RgChunks rg_chunks(int64_t row_bytes);
// Bench only: the target 128-byte steps per warp (<= 0: the default). Process-wide; changes the
// bits (the chunking is part of the order), never row invariance.
void rg_gemv_set_iters(int iters);
// Bench only: weight steps in flight per warp, 2 (the default; <= 0 too) or 3. Same bits either way.
void rg_gemv_set_depth(int depth);

// Process-wide: fast_gemv.h's FP8 calls go to rg_fp8_gemv when the tensor-core GEMVs are on
// (CudaRunOptions::rg_fp8). Other bits than tc_gemv.h's kernels, the same guarantees.
void set_fast_gemv_rg(bool on);
bool fast_gemv_rg();
// Process-wide: the MXFP4 expert calls likewise go to rg_fp4_gemv (CudaRunOptions::rg_fp4).
void set_fast_gemv_rg4(bool on);
bool fast_gemv_rg4();

// Weight-streaming rates of rg against tc_gemv.h at the released decode FP8 shapes, one line each to
// stdout (fast_gemv_bench.cu; tests and the bench).
Status rg_gemv_bench();

}  // namespace fb::cuda
