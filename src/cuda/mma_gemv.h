// Tensor-core GEMVs for decode and verify rows [reference-defining; OFF by default until measured]:
// the block-scaled FP8 / MXFP4 GEMMs of ops.h (fp8_gemm_q, fp4_gemm_q) with each 32-element
// block's dot formed by an FP8 mma (e2m1 weights widened exactly to e4m3), then scaled and summed
// over blocks on the CUDA cores in a fixed order. Products are the reference's; the order and
// rounding inside a block's dot are the tensor core's. Rows are independent (mma_gemv.cu), so a
// decode row and the same row inside a verify step give the same bits: DSpark's greedy identity
// holds with it on. Routed experts: rows grouped by expert on the device, so the rows of a verify
// step that pick the same expert read and widen its weights once.
// Switch: CudaRunOptions::mma_gemv (fast class only). Not bit-identical to the CPU reference.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "cuda/ops.h"

namespace fb::cuda {

// Rows of an expert GEMM grouped by expert (device arrays in one int32 scratch of
// mma_group_ints(M) elements): slot i = the i-th expert in ascending id with rows
// rows[slot_begin[i] .. slot_begin[i+1]) in ascending order; *n_slots slots.
struct MmaGroups {
  int32_t* n_slots = nullptr;
  int32_t* rows = nullptr;         // [M]
  int32_t* slot_expert = nullptr;  // [M + 1]
  int32_t* slot_begin = nullptr;   // [M + 1]
};
int64_t mma_group_ints(int64_t M);
MmaGroups mma_groups_at(int32_t* scratch, int64_t M);
// Rows m = 0..M-1 with expert[m] in [0, E) grouped (one CTA; E <= 4096).
Status mma_group_rows(const int32_t* expert, int64_t M, int E, const MmaGroups& g, cudaStream_t st);

// Whether the operands suit the kernels (K % 32, 8-byte aligned codes and FP8 rows, 4-byte MXFP4).
bool mma_gemv_ok(int64_t K, const void* x_codes, const void* w, int64_t w_stride, bool fp4);

// y [M, N] bf16 = act_quant codes q . W^T (any M; rows in instructions of 16).
Status mma_fp8_gemm_q(const QuantBuf& q, int64_t M, const Fp8W& w, uint16_t* y, cudaStream_t st);
// y [M, N]: row m of expert (grouped by `groups`) reads activation row m / x_div. max_slots: an
// upper bound on the number of distinct experts (min(M, E)).
Status mma_fp4_gemm_q(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& w, const MmaGroups& groups, int64_t max_slots, uint16_t* y,
                      cudaStream_t st);

}  // namespace fb::cuda
