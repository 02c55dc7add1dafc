// Tensor-core decode GEMVs of the fast class [fast]: the block-scaled FP8 and MXFP4 GEMVs of
// fast_gemv.h (same operands, same semantics, same guarantees: deterministic, row-invariant, NMSE
// far below 1e-5 against the exact kernels), built to stream the weights at the HBM rate:
//
//  * the weight matrix is cut into stripes of 16 output rows and each stripe's K into nk chunks
//    (nk and the chunk length from K alone); one CTA of 4 warps owns one (stripe, chunk[, row
//    group or expert row]) and copies its whole weight tile (<= 32 KB) into shared memory with
//    cp.async in one burst, before griddepcontrol.wait where the weights do not depend on the
//    step (dense FP8), so the copy overlaps the previous kernel; many small CTAs per SM keep
//    ~100+ KB per SM in flight and there is no pass structure and no pipeline ramp per column;
//  * ldmatrix gives the mma.m16n8k32 e4m3 A fragments straight from the tile (FP8: as stored;
//    MXFP4: each e2m1 nibble widened to the e4m3 byte of value * 2^-6 by shifts and masks, the
//    2^6 folded into the block scale); B = the act_quant codes of up to 8 activation rows (MXFP4:
//    one row, staged in the k order the widening produces);
//  * each 32-block's mma starts from zero and is scaled into f32 accumulators by weight scale x
//    activation scale (FMA); the 4 warps' partials fold in warp order in shared memory, and the nk
//    chunks' partials in rank order: by default through a per-stream global workspace, the last
//    CTA of a stripe to arrive (an atomic counter) adding them (set_tc_global_fold below), else
//    through distributed shared memory of a thread-block cluster (nk CTAs); no second launch.
//
// Row invariance: an output (row m, column n) is a fixed sum over (chunk, warp, block) whose terms
// are functions of row m's codes and scales and of the weights only; M changes the grid, never a
// row's terms or their order (an mma's output column depends on its own B column only).
// Host header; callers go through fast_gemv.h (set_fast_gemv_tc routes its FP8 / MXFP4 calls here).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "cuda/ops.h"

namespace fb::cuda {

// ya = q . wa^T [M, wa.N] and, when wb != nullptr, yb = q . wb^T (wb->K == wa.K) in one launch.
// K % 32 == 0; 16-byte aligned weights and codes.
Status tc_fp8_gemv(const QuantBuf& q, int64_t M, const Fp8W& wa, uint16_t* ya, const Fp8W* wb, uint16_t* yb, cudaStream_t st);
// Experts: row m reads activation row m / x_div and expert expert[m] (nullptr: 0; < 0: skipped,
// y untouched) of wa (and of wb into yb when wb != nullptr; same shape and strides).
// group_rows (rows of several tokens, 1 < M <= 64): the rows that chose the same expert share one
// read of its tile (up to 8 as the mma's columns) instead of each reading it; the same bits.
// pdl: ExpertPdl (ops.h); the same bits in every mode.
Status tc_fp4_gemv(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, uint16_t* ya, const Fp4W* wb, uint16_t* yb,
                   const int32_t* expert, cudaStream_t st, bool group_rows = false, ExpertPdl pdl = ExpertPdl::kPlain);

// y [M, w.N] = x . w^T for bf16 activations x (row stride ldx) and the FP8 block-scaled weight w,
// i.e. with the exact bf16 values w dequantises to (the reference's BF16 weight: grouped wo_a),
// reading half the bytes of a BF16 copy. The e4m3 tile is widened to bf16 in registers and runs
// as two mma.m16n8k16 per 32-block. Output rows come in groups of grp_rows (a multiple of 32);
// group i reads the K activations at column i * grp_stride of each row (ungrouped: grp_rows = N).
Status tc_fp8_bf16x_gemv(const uint16_t* x, int64_t M, int64_t ldx, int64_t grp_rows, int64_t grp_stride, const Fp8W& w, uint16_t* y,
                         cudaStream_t st);

// The chunking of a K (exposed for tests): nk chunks of kc elements (the last one shorter).
struct TcChunks {
  int nk = 1;
  int kc = 0;
};
TcChunks tc_chunks(int64_t K, bool fp4);
// Bench only: the largest chunk (k elements) per CTA, FP8 and MXFP4 (<= 0: the defaults 2048 / 4096).
// Process-wide; changes the bits (the chunking is part of the order), never row invariance.
void tc_gemv_set_chunk_max(int fp8_k, int fp4_k);

// How the kernels stage the scales: on, by 4-byte cp.async beside the tile (the MXFP4 weight
// scale rows when 4-byte aligned, the FP8 activation scales), one global round trip; off, plain
// loads in a loop (one dependent round trip per iteration). The same bits either way.
// Process-wide, set from CudaRunOptions::tc_async_scales.
void set_tc_async_scales(bool on);
// Shared memory per CTA: on (lean), the FP8 / bf16 kernels stage min(M, 8) activation rows and the
// MXFP4 kernel widens its cp.async'd raw scale bytes at use (no f32 copy), so more CTAs fit per
// SM at decode; off, 8 rows and f32 scale copies. The same bits either way. Process-wide, set from
// CudaRunOptions::tc_lean_smem.
void set_tc_lean_smem(bool on);

bool tc_async_scales();

// How the nk chunks of a split K add up: off, through the distributed shared memory of a thread
// block cluster of nk CTAs (co-scheduled, two cluster barriers); on, through a per-stream global
// workspace where the last CTA of a stripe to arrive (an atomic counter) adds the partials in rank
// order. The same sums in the same order either way: the same bits. A graph capture that would
// need a larger workspace than its stream has folds through the cluster. Process-wide, set from
// CudaRunOptions::tc_global_fold.
void set_tc_global_fold(bool on);
// With the global fold on, launches of one activation row and at most `ctas` CTAs still fold
// through the cluster (the last CTA's serial read of the partials is a larger share of a short
// launch). The same bits.
// Process-wide, set from CudaRunOptions::tc_cluster_fold_ctas (0: every split launch folds globally).
void set_tc_cluster_fold_ctas(int64_t ctas);
bool tc_global_fold();
// Stripes per CTA: 0 or 1, every CTA computes one 16-row stripe of its K chunk (copy its tile,
// then compute); S >= 2, in launches of more than one activation row of the kinds asked for (1:
// FP8 with K % 128 == 0, 2: MXFP4 with rows grouped by expert, 3: both), a CTA computes up to S
// stripes of the same chunk one after the other, the next stripe's tile copied into a second
// buffer while it computes this one (a launch keeps >= 264 CTAs). The same sums in the same order:
// the same bits (test TcStripesSameBits). Process-wide, set from CudaRunOptions::tc_stripes (the
// product: 4, grouped MXFP4 only; kinds 1 and 3 lost their A/B and stay for the test).
void set_tc_stripes(int64_t stripes, int64_t kinds);
int64_t tc_stripes_launches();  // launches that ran several stripes per CTA so far (tests)

// The MXFP4 kernel's lean loop: on, its tile loops run without a division per unit, its mma loop
// reads activations staged in its own order (ungrouped: as the f16 pairs sm_90 runs an e4m3 mma
// on, two m16n8k16) and widens the raw weight scales by a shift (unless the tile holds an e8m0 0
// or 255); off, the plain loop. The same bits either way (test TcLeanLoopSameBits). FP8 and bf16
// kernels are not affected. Process-wide, set from CudaRunOptions::tc_lean_loop.
void set_tc_lean_loop(bool on);
bool tc_lean_loop();
int64_t tc_global_fold_launches();  // launches that folded through a workspace so far (tests)

}  // namespace fb::cuda
