// The prefill chunk size from the HBM budget (issue 26): bytes one tensor-core prefill step of
// `rows` rows holds on the GPU at the released dimensions (the CUDA step's arena, counted from the
// buffers CudaLayerOps and its largest op, the grouped MoE, allocate), and the largest chunk
// whose step fits a budget. Pure arithmetic by count; `flashbox bench --cold-prefill` prints the
// measured high-water mark of the same step beside it.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace fb::memory {

struct PrefillStepBytes {
  uint64_t step = 0;       // buffers that live for the whole step (mHC streams, q/o, quant scratch, taps)
  uint64_t moe = 0;        // the MoE op's temporaries (tensor-core grouping: gathered rows, w1/w3/w2 outputs)
  uint64_t attention = 0;  // the attention/indexer op's temporaries that grow with the context
  uint64_t tc = 0;         // outside the arena: tc_gemm's scratch (expanded activations of the widest
                           // FP8 GEMM input, index dots up to 1 GiB, expanded weights)
  uint64_t arena() const { return step + moe + attention; }
  uint64_t total() const { return arena() + tc; }
};

// `rows` prefill rows whose last position is `context` (the longest key list).
PrefillStepBytes prefill_step_bytes(const model::Config& c, int64_t rows, int64_t context);

// The largest multiple of `quantum` rows (at most max_rows, at least quantum) whose step fits
// `budget_bytes` with the arena's 25% growth slack (cuda/layer_ops.h Arena) on arena(); 0 when not even
// `quantum` rows fit. Prompts shorter than the result run in one chunk.
int64_t prefill_chunk_rows(const model::Config& c, uint64_t budget_bytes, int64_t context, int64_t max_rows = 65536, int64_t quantum = 2048);

}  // namespace fb::memory
