// prefill_step_bytes / prefill_chunk_rows (prefill_budget.h): counts of the CUDA prefill step's
// arena buffers (cuda/layer_ops.h CudaLayerOps, cuda/executor.cu CudaStep) at a config's shape.
#include "memory/prefill_budget.h"

#include <algorithm>

namespace fb::memory {

PrefillStepBytes prefill_step_bytes(const model::Config& c, int64_t rows, int64_t context) {
  const uint64_t T = uint64_t(std::max<int64_t>(rows, 0));
  const uint64_t D = uint64_t(c.dim), hc = uint64_t(c.hc_mult), I = uint64_t(c.moe_inter_dim), hd = uint64_t(c.head_dim);
  const uint64_t qd = uint64_t(c.q_dim()), ql = uint64_t(c.q_lora_rank);
  int K = 1, E = 1;
  for (const model::LayerRole& r : c.roles) {
    K = std::max(K, r.n_active);
    E = std::max(E, r.n_experts);
  }
  const uint64_t n = T * uint64_t(K);  // (row, expert) pairs
  const uint64_t k_max = std::max<uint64_t>({D, ql, uint64_t(c.o_groups) * uint64_t(c.o_lora_rank), I, hd, uint64_t(c.engram_cat_dim()),
                                             uint64_t(c.dspark_target_layer_ids.size()) * D, uint64_t(K) * I});
  auto quant = [](uint64_t elems) { return elems + elems / 32 * 4; };  // e4m3 codes + f32 scales per 32
  PrefillStepBytes b;
  // CudaLayerOps: X and residual [T, hc, D], u / y / h [T, D], qr, q and o, window kv rows, the
  // act_quant scratch of the widest GEMM input, uq and qrq; CudaStep: the DSpark tap rows.
  b.step = T * (2 * hc * D * 2 + 3 * D * 2 + ql * 2 + 2 * qd * 2 + 2 * hd * 2 + hd + hd / 32 + hc * 4) + quant(T * k_max) + quant(T * D) +
           quant(T * ql) + T * uint64_t(c.dspark_target_layer_ids.size()) * D * 2;
  // Selections outlive their op: [T, index_topk] ids per index layer.
  int n_index = 0, min_ratio = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const model::LayerRole& r = c.roles[size_t(l)];
    if (!r.index_source) continue;
    ++n_index;
    if (r.ratio > 0) min_ratio = min_ratio == 0 ? r.ratio : std::min(min_ratio, r.ratio);
  }
  b.step += T * uint64_t(n_index) * (uint64_t(c.index_topk) + 1) * 4;
  // moe() on the tensor-core path: routing ids and weights, the shared expert's a / b [T, I],
  // ye [n, D], ys [T, D], router scores [2, T, E] f32; the grouping: perm, gathered rows xp
  // [n, D], ap / bp / hp [n, I], yp [n, D], weights.
  b.moe = n * 8 + 2 * T * I * 2 + n * D * 2 + T * D * 2 + 2 * T * uint64_t(E) * 4 + n * 4 + n * D * 2 + 3 * n * I * 2 + n * D * 2 + n * 4;
  // The indexer: f32 scores and the candidate pool byte per visible entry of the longest row.
  const uint64_t entries = min_ratio > 0 ? uint64_t(std::max<int64_t>(context, 0)) / uint64_t(min_ratio) : 0;
  b.attention = T * entries * (4 + 1);
  // tc_gemm scratch (cuda/tc_gemm.cu, tc_attention.cu): each FP8 GEMM expands its act_quant
  // input to bf16 [T, K] (the widest K: the grouped output projection's G x o_lora_rank), the
  // index dots take up to 1 GiB, three expanded expert matrices, the largest expanded dense
  // weight (wq_b), slack.
  const uint64_t k_fp8 = std::max<uint64_t>({D, ql, uint64_t(c.o_groups) * uint64_t(c.o_lora_rank), I});
  b.tc = T * k_fp8 * 2 + (uint64_t(1) << 30) + 3 * I * D * 2 + qd * ql * 2 + (uint64_t(256) << 20);
  return b;
}

int64_t prefill_chunk_rows(const model::Config& c, uint64_t budget_bytes, int64_t context, int64_t max_rows, int64_t quantum) {
  quantum = std::max<int64_t>(quantum, 1);
  int64_t best = 0;
  for (int64_t r = quantum; r <= max_rows; r += quantum) {
    const PrefillStepBytes b = prefill_step_bytes(c, r, std::max(context, r));
    if (b.arena() + b.arena() / 4 + b.tc > budget_bytes) break;  // the arena grows to 1.25x its high-water mark
    best = r;
  }
  return best;
}

}  // namespace fb::memory
