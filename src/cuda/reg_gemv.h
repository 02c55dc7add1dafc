// The register-streaming decode GEMVs (reg_gemv.cu) [fast]: the same calls, operands and
// guarantees as tc_gemv.h's tile kernels (deterministic, row-invariant, block-scaled FP8 / MXFP4
// with the reference's products), other bits (another k order inside a block and another split of
// K). tc_gemv.h routes to them when set_tc_reg_stream(true).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "cuda/ops.h"

namespace fb::cuda {

// As tc_fp8_gemv / tc_fp4_gemv (checked by them).
Status reg_fp8_gemv(const QuantBuf& q, int64_t M, const Fp8W& wa, uint16_t* ya, const Fp8W* wb, uint16_t* yb, cudaStream_t st);
Status reg_fp4_gemv(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, uint16_t* ya, const Fp4W* wb, uint16_t* yb, const int32_t* expert,
                    cudaStream_t st);
// Bench only: the weight loads' L2 256-byte prefetch hint (default on; the same bits either way).
void reg_gemv_set_prefetch(bool on);
// Bench only: 32-blocks per load batch, FP8 / MXFP4 (4 or 8; anything else: the defaults). The
// same bits (the order of the sums does not change).
void reg_gemv_set_batch(int fp8_u, int fp4_u);

}  // namespace fb::cuda
