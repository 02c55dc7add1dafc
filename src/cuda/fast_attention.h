// [fast] sparse attention with a sink for decode / verify / draft steps (few rows): the same keys
// (AttnKeys: window FP8 rows, selected FP4 entries, dequantised to the reference's exact bf16
// values), the same operands (bf16 q and keys, bf16 probabilities for P.V, f32 sums), but the
// dots and P.V sums on tensor cores (mma.m16n8k16 bf16, f32 accumulation) and the softmax as a
// split over 64-key blocks with a fixed combine:
//   tile kernel, CTA (block b, group of 16 heads, row t): dequantises the block's keys once into
//     shared memory, S = Q K^T, block max m_b, p = exp(z - m_b), l_b = sum p, O_b = bf16(p) V,
//     written as f32 partials;
//   combine kernel, CTA (row, head): M = max m_b, o = sum_b e^(m_b - M) O_b / (sum_b e^(m_b - M)
//     l_b + e^(sink - M)), in block order, rounded to bf16.
// Why: the exact kernels (attention.cu) give every product its own rounding in the CPU's order
// and ran ~70 us per layer at a 4K context (five launches, scalar dots), ~2.8 ms of a decode step.
//
// Guarantees: deterministic (fixed decomposition, no atomics); row-invariant (a row's CTAs read
// only its own q and keys; the block count of a row comes from its own key count); NOT
// bit-identical to the exact class (sums in the tensor cores' order, p relative to the block's
// own max, hardware exp): cuda_fast_attention_test bounds it against the CPU reference.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "base/status.h"
#include "cuda/ops.h"

namespace fb::cuda {

constexpr int64_t kFastAttnMaxRows = 64;

// True when fast_sparse_attention handles the shape: head_dim a multiple of 64 up to 512, up to
// kFastAttnMaxRows rows (any head count: groups of 16 heads, the last one padded).
bool fast_attention_ok(int64_t T, int d);
// f32 scratch elements for T rows whose key lists hold at most max_keys entries (one batch).
int64_t fast_attention_floats(int64_t T, int n_heads, int d, int max_keys);

// Tests: the f32 budget of one launch pair's partials (rows are processed in batches that fit;
// a row's arithmetic never depends on the batch). 0 restores the default (32 Mi floats).
void fast_attention_set_batch_floats(int64_t floats);

// Process-wide (like set_fast_gemv_tc; the executor sets it from CudaRunOptions::attn_heads_per_cta):
// heads per tile CTA, 1..16 (default 16). Other bits, the same guarantees.
void fast_attention_set_heads_per_cta(int heads);

// RoPE folded into the attention kernels: ops.h rope() at the step rows' positions pos[t] (cos /
// sin tables [positions, half], the last 2 half dims of every head), the same arithmetic and the
// same bits as that kernel. q: the tile kernel rotates the query as it loads it (q in memory stays
// un-rotated); o: the combine kernel applies the inverse to the bf16 output before it stores it.
// Saves the two launches (and one write and read of q / o each) of a decode layer's critical path.
struct AttnRope {
  const int64_t* pos = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  int half = 0;        // rope_head_dim / 2
  bool q = false;      // rotate q on load
  bool o = false;      // inverse-rotate the output
};

// out [T, n_heads, d] bf16. keys.max_keys must bound every row's key count (the kernel traps
// otherwise: a row is never cut short); keys.split / predequant are not used.
Status fast_sparse_attention(const uint16_t* q, int64_t T, int n_heads, int d, const AttnKeys& keys, const float* sinks, float scale, float* scratch,
                             uint16_t* out, cudaStream_t st, const AttnRope& rope = {});

// [fast] the indexer's scores (ops.h index_scores' contract) with the q.k dots on tensor cores
// (mma.m16n8k16 bf16, f32 sums in the tensor cores' order, rounded to bf16 as the reference rounds
// each dot), the rest of the reference's chain (relu, x weight, bf16, head sum in head order,
// bf16) as the exact kernel. Row-invariant (a CTA reads one row's q, weights and keys) and
// deterministic; an entry differs from the exact score only where a dot's f32 sum rounds to the
// other neighbouring bf16. Shapes: up to kFastAttnMaxRows rows, IH a multiple of 16 up to 64, ihd a
// multiple of 32 up to 128, 4-byte aligned key rows (fast_index_scores_ok; the released 32 x 128).
bool fast_index_scores_ok(int64_t T, int IH, int ihd, int64_t key_bytes, const std::vector<uint64_t>& keys_base);
Status fast_index_scores(const uint16_t* iq, const uint16_t* wts, int64_t T, int IH, int ihd, const uint64_t* keys_base, int64_t key_bytes,
                         const int64_t* n_vis, const int64_t* n_scored, float* I, int64_t ld, cudaStream_t st, const uint8_t* mask = nullptr,
                         int64_t mask_ld = 0, const int64_t* mask_len = nullptr);

}  // namespace fb::cuda
