// "Fast" decode GEMVs: the block-scaled FP8 / MXFP4 and bf16 GEMMs of ops.h (fp8_gemm_q,
// fp4_gemm_q, fp4_gemm2_q, bf16_gemm) on the same operands and with the same semantics, but NOT
// bit-identical to the CPU reference: each output is an f32 sum in a fixed order of our choosing,
// with fused multiply-adds and the per-block scales folded once per block partial, rounded once to
// bf16 (RNE) at the end. The exact kernels pay for the CPU's order (blocks16 / lanes32) with
// instruction count; these aim at streaming the weights at the HBM roofline for 1..8 rows.
//
// Guarantees (fast_gemv.cu says how):
//  * deterministic: the same call gives the same bits every time (no atomics, fixed orders);
//  * row-invariant: the bits of output row m depend only on row m's operands (its activation
//    row, its expert) and on the weight shape (N, K[, G]), never on M or on the other rows, so a
//    decode row and the same row inside a verify batch agree bit for bit;
//  * accuracy: the only differences from the exact kernels are f32 summation order and FMA
//    rounding (every product of the quantised operands is exact in f32), far below the final
//    bf16 rounding; fast_gemv_test.cpp bounds the NMSE at 1e-5.
// Host header, same conventions as ops.h: device pointers, a stream, Status; shapes that break a
// kernel's assumptions are bugs (FB_CHECK), including 16-byte alignment of the vector operands.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "cuda/ops.h"

namespace fb::cuda {

// y [M, N] bf16 = act_quant codes q [M, K] . W^T (FP8 e4m3 + e8m0 32x32 blocks). K % 32 == 0.
Status fast_fp8_gemv_q(const QuantBuf& q, int64_t M, const Fp8W& w, uint16_t* y, cudaStream_t st);
// Two weights of the same K over the same activation rows in one launch (shapes may differ):
// ya = q . wa^T, yb = q . wb^T, each output bit-identical to fast_fp8_gemv_q's.
Status fast_fp8_gemv2_q(const QuantBuf& q, int64_t M, const Fp8W& wa, uint16_t* ya, const Fp8W& wb, uint16_t* yb, cudaStream_t st);
// y [M, N]: row m uses activation row m / x_div and expert expert[m] (its matrix at w.w + e *
// w_stride, scales at w.s + e * s_stride; expert == nullptr: expert 0). expert[m] < 0: row m is
// skipped (y untouched). K % 32 == 0, w_stride % 16 == 0.
// group_rows: rows of several tokens (the tensor-core kernels let rows sharing an expert share its
// reads, tc_gemv.h; the same bits either way).
// pdl: ExpertPdl (ops.h), the tensor-core kernels only (the others run kPlain).
Status fast_fp4_gemv_q(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& w, const int32_t* expert, uint16_t* y, cudaStream_t st,
                       bool group_rows = false, ExpertPdl pdl = ExpertPdl::kPlain);
// Two weights of the same shape and strides (w1, w3) over the same rows and experts in one pass
// over x: ya = x . wa^T, yb = x . wb^T, each output bit-identical to fast_fp4_gemv_q's.
Status fast_fp4_gemv2_q(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, const Fp4W& wb, const int32_t* expert, uint16_t* ya,
                        uint16_t* yb, cudaStream_t st, bool group_rows = false, ExpertPdl pdl = ExpertPdl::kPlain);
// bf16 x bf16 with bf16_gemm's grouped semantics: for g < G, y + g*gy [M, N] (row stride ldy,
// bf16 or f32, or f32 added to y) = (x + g*gx) [M, K] (row stride ldx) . (w + g*gw) [N, K]^T.
// K, ldx, gx, gw % 8 == 0 and x, w 16-byte aligned (16-byte rows).
Status fast_bf16_gemv(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, void* y, int64_t ldy, GemmOut out,
                      int64_t G, int64_t gx, int64_t gw, int64_t gy, cudaStream_t st);

// Process-wide: the kernels compiled with a register cap (3 CTAs of 256 threads per SM) instead of
// the compiler's choice, for more weight bytes in flight. Same arithmetic, same bits
// (fast_gemv_test). The executor turns it on (CudaRunOptions::fast_occupancy, measured with
// `bench --ab fast_occupancy=0,1`: docs/results.md); off here until a caller sets it.
void set_fast_gemv_occupancy(bool on);
// Process-wide: the FP8 and MXFP4 calls above run on the tensor-core kernels of tc_gemv.h (a
// different fixed order: other bits, the same guarantees; CudaRunOptions::tc_gemv). bf16 is
// unaffected. Off here until a caller sets it.
void set_fast_gemv_tc(bool on);
bool fast_gemv_tc();

// Weight-streaming rate of the fast and exact FP8 / MXFP4 GEMVs at a few decode shapes (cudaEvent
// timing, averaged over repeats), one line each to stdout. For tests and the bench; allocates and
// frees its own buffers, synchronises the device.
Status fast_gemv_bench();

}  // namespace fb::cuda
