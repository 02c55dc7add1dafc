// fb::cuda op launchers: one per CPU primitive of cpu/ops.h (and per loop of cpu/executor.cpp),
// each reproducing the CPU's rounding points and summation order bit for bit (docs/numerics.md).
// Host header: plain device pointers and a stream, no CUDA types beyond cudaStream_t. Every
// launcher returns Status; shapes that break a kernel's assumptions are bugs (FB_CHECK).
// Layouts: row-major, [rows, cols]; bf16 travels as uint16_t; "ptr lists" are uint64 device
// addresses (0 = empty entry, the reference's -1).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "model/hc_mix.h"

namespace fb::cuda {

using HcMix = model::HcMix;  // POD: pre[16], post[16], comb[256]

// FP8 e4m3 [N, K] + e8m0 [ceil(N/32), K/32] (32x32 blocks).
struct Fp8W {
  const uint8_t* w = nullptr;
  const uint8_t* s = nullptr;
  int64_t N = 0, K = 0;
};
// MXFP4 packed e2m1 [N, K/2] + e8m0 [N, K/32]; expert e's matrix at w + e * w_stride.
struct Fp4W {
  const uint8_t* w = nullptr;
  const uint8_t* s = nullptr;
  int64_t N = 0, K = 0;
  int64_t w_stride = 0, s_stride = 0;  // bytes between experts
};
// act_quant output: e4m3 codes [M, K] and power-of-two f32 scales [M, K/32].
struct QuantBuf {
  uint8_t* codes = nullptr;
  float* scales = nullptr;
  int64_t capacity = 0;  // elements (codes)
};
// How a routed-expert GEMV launch meets programmatic dependent launch (pdl.cuh;
// CudaRunOptions::fp4_early_tiles). kPlain: trigger at entry, wait before the expert ids. A chain
// w1w3 (kTriggerAfterWait) -> one PDL kernel -> w2 (kIdsBeforeWait): w2 cannot launch before the
// middle kernel's CTAs have started, which cannot launch before w1w3's CTAs have waited, i.e.
// before the kernel that wrote the ids has completed; so w2 reads its ids (through L2) and copies
// its expert tiles before its own wait. The same bits in every mode.
enum class ExpertPdl { kPlain, kTriggerAfterWait, kIdsBeforeWait };

// ---- quantisers (cpu::act_quant_row, fp8_qdq_row, fp4_*_qdq_row) --------------------------
Status act_quant(const uint16_t* x, int64_t M, int64_t K, const QuantBuf& q, cudaStream_t st);
// Compact rows [M, ld_out] (codes then scales) and/or the exact bf16 QDQ value [M, K].
Status fp8_qdq(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld_compact, uint16_t* out, cudaStream_t st);
Status fp4_e8m0_qdq(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld_compact, uint16_t* out, cudaStream_t st);
Status fp4_e4m3_qdq(const uint16_t* x, int64_t M, int64_t K, uint8_t* compact, int64_t ld_compact, uint16_t* out, cudaStream_t st);
// Compact rows named by a ptr list -> bf16 [n, K] (cpu::fp8_dequant_row).
Status fp8_dequant_rows(const uint64_t* rows, int64_t n, int64_t K, uint16_t* out, cudaStream_t st);

// ---- GEMMs (cpu::fp8_gemm, fp4_gemm, bf16_gemm, f32_gemm_bf16w) ------------------------------
// y [M, N] bf16 = act_quant(x [M, K]) . W^T in the blocks16 order.
Status fp8_gemm(const uint16_t* x, int64_t M, const Fp8W& w, uint16_t* y, const QuantBuf& q, cudaStream_t st);
Status fp8_gemm_q(const QuantBuf& q, int64_t M, const Fp8W& w, uint16_t* y, cudaStream_t st);
// The FP8 GEMV's product-and-add as one fused multiply-add (exact: e4m3 x e4m3 products are exact
// in f32, numerics.cuh fma_exact_product) or as the CPU's separate multiply and add. Same bits
// either way; process-wide, for interleaved A/B (`bench --ab fp8_fma=0,1`). Default on.
void set_fp8_gemv_fma(bool on);
// y [M, N]: row m uses activation row m / x_div and expert expert[m] (nullptr: expert 0).
Status fp4_gemm_q(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& w, const int32_t* expert, uint16_t* y, cudaStream_t st);
// Two weights of the same shape over the same rows and experts (w1 and w3): ya = x . wa^T,
// yb = x . wb^T in one pass over x, each output exactly as fp4_gemm_q computes it.
Status fp4_gemm2_q(const QuantBuf& q, int64_t M, int64_t x_div, const Fp4W& wa, const Fp4W& wb, const int32_t* expert, uint16_t* ya,
                   uint16_t* yb, cudaStream_t st);
// bf16 x bf16 in the lanes32 order, G groups: x + g*gx, w + g*gw, y + g*gy (elements).
enum class GemmOut { kBf16, kF32, kF32Add };
Status bf16_gemm(const uint16_t* x, int64_t M, int64_t K, int64_t ldx, const uint16_t* w, int64_t N, void* y, int64_t ldy, GemmOut out,
                 int64_t G, int64_t gx, int64_t gw, int64_t gy, cudaStream_t st);

// ---- norms, RoPE -----------------------------------------------------------------------------
// y [M, n] = bf16(w * (x * rsqrt(mean(x^2) + eps))); rows optional (ptr to row indices of x).
Status rms_norm(const uint16_t* x, int64_t M, int64_t n, const uint16_t* w, float eps, uint16_t* y, cudaStream_t st);
// In place on x [M, heads, width]: the last rope_dim of each head at pos[m] (cos/sin tables
// [n_pos, rope_dim/2] computed on the host by model::RopeTable).
Status rope(uint16_t* x, int64_t M, int heads, int64_t width, int rope_dim, const int64_t* pos, const float* cos_t, const float* sin_t,
            bool inverse, cudaStream_t st);

// ---- mHC (cpu::hc_mixes_raw + hc_split_sinkhorn, hc_pre, hc_post) -------------------------------
Status hc_mixes(const uint16_t* x, int64_t T, int hc, int64_t dim, const float* fn, float norm_eps, const float* scale, const float* base,
                int iters, float eps, HcMix* out, cudaStream_t st);
// hc_mixes with the (2 + hc) hc mix dots of each row given (dots [T, (2 + hc) hc] f32, e.g. from
// tensor cores, tc_hc_mixes): the squares' sum, the scaling and Sinkhorn exactly as hc_mixes.
Status hc_mixes_with_dots(const uint16_t* x, int64_t T, int hc, int64_t dim, const float* dots, float norm_eps, const float* scale,
                          const float* base, int iters, float eps, HcMix* out, cudaStream_t st);
// y [n, dim] = sum_a pre[a] X_a for rows rows[i] (nullptr: row i); pre of row t at pre + t*pre_stride.
Status hc_pre(const uint16_t* x, int64_t n, const int32_t* rows, int hc, int64_t dim, const float* pre, int64_t pre_stride, uint16_t* y,
              cudaStream_t st);
// u = act_quant-ready RMSNorm(hc_pre(X, pre)): y [T, dim] = rms_norm(hc_pre(x, pre), w) and q = act_quant(y),
// one fused kernel for T <= 256 rows (else the three launches, hc_pre's output in tmp [T, dim]);
// every bit as the separate ops.
Status hc_pre_norm_quant(const uint16_t* x, int64_t T, int hc, int64_t dim, const float* pre, int64_t pre_stride, const uint16_t* w, float eps,
                         uint16_t* tmp, uint16_t* y, const QuantBuf& q, cudaStream_t st);
Status hc_post(const uint16_t* y, const uint16_t* x, int64_t T, int hc, int64_t dim, const HcMix* mix, uint16_t* out, cudaStream_t st);
// pre[t, :] = mix[t].pre
Status hc_take_pre(const HcMix* mix, int64_t T, int hc, float* pre, cudaStream_t st);

// ---- rows: embedding, stream mean, row copies ---------------------------------------------------
// X [T, hc, D] = hc copies of src[t] (bf16 [D] ptr list); pre = one-hot stream 0.
Status embed_rows(const uint64_t* src, int64_t T, int hc, int64_t D, uint16_t* X, float* pre, cudaStream_t st);
// out[t * ld_out + d] = bf16(sum_i X[t, i, d] / hc)
Status stream_mean(const uint16_t* X, int64_t T, int hc, int64_t D, uint16_t* out, int64_t ld_out, cudaStream_t st);
// dst[i] <- src[i], row_bytes each (ptr lists); i independent (callers drop duplicate dsts).
Status copy_rows(const uint64_t* src, const uint64_t* dst, int64_t n, int64_t row_bytes, cudaStream_t st);

// ---- attention (cpu::sparse_attention over the key list of each row) -------------------------------
struct AttnKeys {
  const uint64_t* win = nullptr;       // ptr list of FP8 compact rows (d codes + d/32 e8m0), all rows concatenated
  const int32_t* win_off = nullptr;    // [T + 1] offsets into win
  const int32_t* sel = nullptr;        // [T, sel_ld] compressed entry ids (-1 = empty); nullptr: none
  const int32_t* sel_count = nullptr;  // [T]
  int64_t sel_ld = 0;
  const uint64_t* comp_base = nullptr; // [T] FP4 compact rows (d/2 packed + d/16 e4m3) of the row's session
  // Key-block split (few rows): the 64-key blocks of a row run in parallel CTAs and a third kernel
  // folds them in the CPU's block order (exact: the CPU's online softmax adds each block's P.V sum
  // and p-sum as a whole). Needs an upper bound on any row's key count and f32 scratch of
  // attention_split_floats(...) elements; without them (or for many rows) one CTA per (row, head).
  int max_keys = 0;
  float* split = nullptr;
  // With the split: dequantise every 64-key tile once into the scratch (one pass), and the score
  // and P.V kernels of every head group copy it (same values, fewer instructions).
  bool predequant = true;
};
// f32 scratch for the key-block split, 0 when the split is not used for this shape.
int64_t attention_split_floats(int64_t T, int n_heads, int d, int max_keys);
Status sparse_attention(const uint16_t* q, int64_t T, int n_heads, int d, const AttnKeys& keys, const float* sinks, float scale, uint16_t* out,
                        cudaStream_t st);

// ---- indexer (cpu::CpuStep::index_select) -----------------------------------------------------------
// I [T, ld] f32: bf16 score chain over entries j < n_vis[t] of keys_base[t] (FP4 e8m0 compact
// rows, key_bytes each), -inf for n_vis <= j < n_scored. With a pool mask (as topk_select takes
// it), entries outside the pool are not scored: -inf, the value the mask gives them anyway.
Status index_scores(const uint16_t* iq, const uint16_t* wts, int64_t T, int IH, int ihd, const uint64_t* keys_base, int64_t key_bytes,
                    const int64_t* n_vis, const int64_t* n_scored, float* I, int64_t ld, cudaStream_t st, const uint8_t* mask = nullptr,
                    int64_t mask_ld = 0, const int64_t* mask_len = nullptr);
// Candidate pool mask [T, ld] (spec/11 §4.9): newest visible block pinned, top `keep` blocks.
Status candidate_pool(const float* I, int64_t T, int64_t ld, const int64_t* n_scored, const int64_t* n_vis, int64_t block, int64_t keep,
                      uint8_t* mask, cudaStream_t st);
// Top-k (ties toward the lower index), ascending ids, ids >= n_vis -> -1. mask (optional)
// restricts scores to pool entries j < mask_len[t] with mask[t, j] != 0.
Status topk_select(float* I, int64_t T, int64_t ld, const int64_t* n_scored, const int64_t* n_vis, const uint8_t* mask, int64_t mask_ld,
                   const int64_t* mask_len, int64_t k_max, int32_t* sel, int32_t* count, cudaStream_t st);
// x[i] = bf16(bf16(x[i]) * s)
Status scale_bf16(uint16_t* x, int64_t n, float s, cudaStream_t st);

// ---- MoE (cpu::route, swiglu_row, the f32 fold) --------------------------------------------------
// experts/weights [T, top_k], ascending expert id (the fold order); bias_vl used where image[t].
// scratch: 2 * T * E floats (per-expert scores of every row).
Status route(const uint16_t* u, int64_t T, int64_t D, const uint16_t* gate_w, int E, const float* bias, const float* bias_vl,
             const uint8_t* image, int top_k, float gate_temp, bool norm_topk, float route_scale, int32_t* experts, float* weights, float* scratch,
             cudaStream_t st);
// route() from dots computed elsewhere: scratch + T * E holds z = u . gate_w^T [T, E] (f32; a
// prefill step's tensor-core matmul); the scores, biased scores and selection as route() makes
// them from its own dots.
Status route_from_dots(int64_t T, int E, const float* bias, const float* bias_vl, const uint8_t* image, int top_k, float gate_temp, bool norm_topk,
                       float route_scale, int32_t* experts, float* weights, float* scratch, cudaStream_t st);
// act_quant(swiglu(a, b) [x weight[m]]) into q without storing h (n % 32 == 0): the codes and
// scales swiglu followed by act_quant give.
Status swiglu_quant(const uint16_t* a, const uint16_t* b, int64_t M, int64_t n, float limit, const float* weight, const QuantBuf& q, cudaStream_t st);
// h [M, n] = swiglu(a, b) (x weight[m] when weight != nullptr).
Status swiglu(const uint16_t* a, const uint16_t* b, int64_t M, int64_t n, float limit, const float* weight, uint16_t* h, cudaStream_t st);
// y[t] = bf16(sum_k ye[t, k] (f32, k order) + ys[t])
Status moe_combine(const uint16_t* ye, int K, const uint16_t* ys, int64_t T, int64_t D, uint16_t* y, cudaStream_t st);

// ---- Engram (cpu::CpuStep::engram) --------------------------------------------------------------
// E [T, n_cols * hd] = FP8 table rows hashes[t * ld_hash + col] dequantised.
Status engram_gather(const uint8_t* table, const uint8_t* table_scale, const int64_t* hashes, int64_t ld_hash, int64_t T, int n_cols, int hd,
                     uint16_t* E, cudaStream_t st);
// Per stream gate and update of X [T, hc, D] from kv [T, (1 + hc) * D].
Status engram_gate(uint16_t* X, const uint16_t* kv, const uint16_t* q_w, const uint16_t* k_w, int64_t T, int hc, int64_t D, float eps,
                   float inv_sqrt_d, const uint8_t* image, cudaStream_t st);

// ---- compressor (ratio-2 softmax pooling of cpu::CpuStep::compress) ----------------------------------
// pooled[i] = bf16(k0 * softmax0 + k1 * softmax1), sources [k | g] f32 [2 * hd] via ptr lists.
Status ratio2_pool(const uint64_t* even, const uint64_t* odd, int64_t n, int64_t hd, uint16_t* pooled, cudaStream_t st);

// ---- DSpark draft head (cpu::CpuDraftStep::markov_chain) ---------------------------------------------
// lk[v] += e(prev) . HM[v] for all v (prev = *prev_id); then *next_id = argmax (first max).
Status markov_bias(float* lk, int64_t V, int r, const uint16_t* EM, const uint16_t* HM, const int32_t* prev_id, cudaStream_t st);
Status argmax(const float* x, int64_t n, int32_t* out, cudaStream_t st);
// out[r] = model::logits_argmax of row r of x [rows, V] (the sampler's greedy pick: NaN skipped)
Status rows_argmax(const float* x, int64_t rows, int64_t V, int32_t* out, cudaStream_t st);
// markov_bias, argmax and confidence of one chain token in one launch, the same bits
// (markov_step_fits: r % 8 == 0, r <= 1024, 16-byte aligned EM and HM). Scratch: ctas (value,
// index) pairs and an arrival counter that starts at 0 (the kernel leaves it at 0).
struct MarkovScratch {
  float* part_v = nullptr;
  int64_t* part_i = nullptr;
  unsigned* counter = nullptr;
  int ctas = 0;
};
int markov_step_ctas();
bool markov_step_fits(int64_t V, int r, const uint16_t* EM, const uint16_t* HM);
Status markov_step(float* lk, int64_t V, int r, const uint16_t* EM, const uint16_t* HM, const int32_t* prev_id, const uint16_t* hH, int64_t D,
                   const uint16_t* wc, int32_t* next_id, float* conf, const MarkovScratch& ws, cudaStream_t st);
// *out = f32([hH | e(prev)]) . wc over D + r
Status confidence(const uint16_t* hH, int64_t D, const uint16_t* EM, int r, const int32_t* prev_id, const uint16_t* wc, float* out,
                  cudaStream_t st);

}  // namespace fb::cuda
