// CPU reference primitives: the numerics of spec/11 §1 written as plain scalar loops. These
// DEFINE our arithmetic; every CUDA kernel is compared against them and they are compared
// against the official op vectors (fixtures/ops). bf16 values travel as raw uint16_t.
// Summation orders are sequential unless a comment says otherwise [reference-defining].
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "base/dtype.h"
#include "base/tensor_view.h"
#include "model/hc_mix.h"
#include "model/rope.h"

namespace fb::cpu {

using bf16_t = uint16_t;  // raw bfloat16 bits

inline float bf(bf16_t b) { return bf16_to_f32(b); }
inline bf16_t to_bf(float f) { return bf16_bits_from_f32(f); }

// ---- quantisers (spec/11 §1.2, §1.4, §1.5) ----------------------------------------------------
// Scale of an act_quant block: amax floored at 1e-4, times f32(1/448), rounded UP to 2^k.
float fp8_block_scale(float amax);
// act_quant over a row of K (multiple of 32): e4m3 codes and one power-of-two scale per 32.
void act_quant_row(const bf16_t* x, int64_t K, uint8_t* codes, float* scales);
// Window-KV QDQ: compact form (codes + e8m0 per 32) and its exact bf16 value.
void fp8_qdq_row(const bf16_t* x, int64_t K, uint8_t* codes, uint8_t* scales_e8m0, bf16_t* out);
void fp8_dequant_row(const uint8_t* codes, const uint8_t* scales_e8m0, int64_t K, bf16_t* out);
// Indexer FP4: e2m1 codes (packed, even element low nibble) + e8m0 per 32 (spec/11 §1.5a).
void fp4_e8m0_qdq_row(const bf16_t* x, int64_t K, uint8_t* packed, uint8_t* scales_e8m0, bf16_t* out);
void fp4_e8m0_dequant_row(const uint8_t* packed, const uint8_t* scales_e8m0, int64_t K, bf16_t* out);
// Compressed-KV FP4: e2m1 codes + e4m3 scale per 16, no global scale (spec/11 §1.5b).
void fp4_e4m3_qdq_row(const bf16_t* x, int64_t K, uint8_t* packed, uint8_t* scales_e4m3, bf16_t* out);
void fp4_e4m3_dequant_row(const uint8_t* packed, const uint8_t* scales_e4m3, int64_t K, bf16_t* out);

// ---- GEMMs (spec/11 §1.3); x row-major [M, K], weights [N, K]; outputs [M, N] -----------------
// FP8 weight (e4m3 + e8m0 32x32 blocks) x act_quant(x): 32-term block dots in f32 (sequential),
// blocks accumulated in increasing order, one bf16 rounding.
void fp8_gemm(const bf16_t* x, int64_t M, const TensorView& w, const TensorView& w_scale, bf16_t* y);
// MXFP4 weight (packed e2m1 [N, K/2] + e8m0 [N, K/32]) x act_quant(x); same structure.
void fp4_gemm(const bf16_t* x, int64_t M, const TensorView& w, const TensorView& w_scale, bf16_t* y);
// bf16 x bf16 -> f32 accumulate -> bf16.
void bf16_gemm(const bf16_t* x, int64_t M, int64_t K, const bf16_t* w, int64_t N, bf16_t* y);
// f32 x (bf16 weight promoted exactly) -> f32.
void f32_gemm_bf16w(const float* x, int64_t M, int64_t K, const bf16_t* w, int64_t N, float* y);
void f32_gemm(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y);

// ---- norms, RoPE ------------------------------------------------------------------------------
// y = bf16(w * (x * rsqrt(mean(x^2) + eps))), one rounding (spec/11 §1.1).
void rms_norm(const bf16_t* x, int64_t n, const bf16_t* w, float eps, bf16_t* y);

// Rotates the last rope_dim elements of x[width] at position p with the shared table of
// model/rope.h (inverse = conjugate).
void apply_rope(bf16_t* x, int64_t width, const model::RopeTable& t, int64_t pos, bool inverse);

// ---- sparse attention with sink (spec/11 §1.7) -------------------------------------------------
// q: [n_heads, d] bf16 for one query; keys: list of row pointers (nullptr = empty entry, the
// reference's -1), each d bf16 (K == V); out: [n_heads, d] bf16. Blocks of 64 in list order.
void sparse_attention(const bf16_t* q, int n_heads, int d, const std::vector<const bf16_t*>& keys, const float* sinks, float scale,
                      bf16_t* out);

// ---- mHC (spec/11 §1.8) ------------------------------------------------------------------------
// mixes m[j] = (Fn[j,:] . v) * rsqrt(mean(v^2) + norm_eps) for the flattened streams v.
void hc_mixes_raw(const bf16_t* x_streams, int hc, int64_t dim, const float* fn, float norm_eps, float* mixes);
// y = bf16(sum_a pre[a] * X_a).
void hc_pre(const bf16_t* x_streams, int hc, int64_t dim, const float* pre, bf16_t* y);
// X'_b = bf16(post_b * y + sum_a comb[a][b] * X_a).
void hc_post(const bf16_t* y, const bf16_t* x_streams, int hc, int64_t dim, const model::HcMix& mix, bf16_t* out_streams);

// ---- candidate pool (spec/11 §4.9) -------------------------------------------------------------
// One query's pool over its scored slice I [n] (index scores, -inf = not scored): blocks of
// block_size scored by their max, the newest visible block (holding n_vis - 1) pinned, the top
// topk_blocks kept (the pinned one counts, ties to the lower block), -inf blocks dropped.
// Returns a mask [n], 1 = candidate.
std::vector<uint8_t> candidate_pool(const std::vector<float>& I, int64_t n_vis, int64_t block_size, int64_t topk_blocks);

// ---- MoE router (spec/11 §5 steps 1-4) ---------------------------------------------------------
struct Routing {
  std::vector<int> experts;     // top-k in the reference's order (descending biased score)
  std::vector<float> weights;   // normalised x route_scale
  float margin = 0.0f;          // model::selection_margin of the biased scores (near-tie report)
  int swaps = 0;                // experts a RoutePreference replaced
};
// Cache-conditional routing [approx-approved], off by default (issue 22; quality in
// docs/tiers.md): a chosen expert whose bytes are not resident gives way to the best unchosen
// resident one whose biased score is within `margin` of its own (the weakest chosen expert first;
// each resident expert taken once). The weights are the new set's scores, normalised as usual.
struct RoutePreference {
  float margin = 0.0f;                  // in biased-score units; <= 0: off
  std::function<bool(int)> resident;    // expert e of this layer is resident
};
Routing route(const bf16_t* u, int64_t dim, const TensorView& gate_w, const float* bias, int top_k, float gate_temp, bool norm_topk,
              float route_scale, const RoutePreference* prefer = nullptr);
// The preference's swaps on a sorted top-k (tested alone): returns the new set in descending
// biased score (ties to the lower id); `swaps` (optional) counts the replaced experts.
std::vector<int> prefer_resident(const std::vector<int>& topk, const float* biased, int64_t n_experts, const RoutePreference& p, int* swaps = nullptr);

// SwiGLU with the release's clamps, routing weight applied before the down projection:
// h = silu(min(a, limit)) * clamp(b, -limit, limit) * w; returns bf16(h).
void swiglu_row(const bf16_t* a, const bf16_t* b, int64_t n, float limit, float weight, bool apply_weight, bf16_t* h);

}  // namespace fb::cpu
