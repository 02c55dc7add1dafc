// [fast] fused small ops of a decode / verify / draft step (1..64 rows): the mHC site (mix dots,
// Sinkhorn, collapse, RMSNorm, act_quant) in one launch, hc_post in place with the carried pre,
// RMSNorm + act_quant, act_quant, SwiGLU + act_quant. Same operands and formulas as the exact ops
// of ops.h (activations quantised with the same rule, bf16 roundings where the reference rounds),
// but sums in a fixed tree order of our choosing with FMA and hardware exp / e4m3 conversion, so
// NOT bit-identical to the CPU: cuda_fast_small_test bounds each against the exact kernels.
//
// Why: in the exact class these ops are ~40 dependent launches per layer of latency-bound
// kernels (the mHC collapse + norm + quant of one row ran 17.5 us in one CTA, the Sinkhorn 10.5 us
// in one warp, ncu 2026-12-01), about a third of the decode step.
//
// Guarantees: deterministic (fixed decomposition, no atomics: the mHC site's per-CTA partials are
// combined in one fixed tree); row-invariant (a row's bits depend on
// its own operands and the shapes only, never on the number of rows). Every kernel takes part in
// programmatic dependent launch (pdl.cuh) when set_fast_pdl(true).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "base/status.h"
#include "cuda/ops.h"

namespace fb::cuda {

// Process-wide (like set_fast_gemv_occupancy): launch the fast kernels (these and fast_gemv.h's)
// with programmatic dependent launch. The executor sets it from CudaRunOptions::pdl.
void set_fast_pdl(bool on);
bool fast_pdl();

constexpr int64_t kFastSmallMaxRows = 64;

// Scratch of fast_hc_site for up to kFastSmallMaxRows rows of width `dim`: per-CTA partial sums
// and the collapsed rows (fully rewritten by every call; calls on one stream never overlap).
struct FastHcScratch {
  float* partials = nullptr;
  uint16_t* h = nullptr;
  float* tot = nullptr;  // a deferred site's row sums, read by fast_hc_sinkhorn
  int64_t dim = 0;
  static size_t bytes(int64_t dim);
  // Carves the arrays out of `mem` (bytes(dim) bytes, 16-byte aligned).
  static FastHcScratch at(void* mem, int64_t dim);
};

// A site's hc_post left for the next site's partial kernel (CudaRunOptions::defer_hc_post):
// X[t, b] = bf16(post[b] y[t] + sum_a comb[a, b] X[t, a]) with mix[t], and pre_out[t, :] =
// mix[t].pre when pre_out != nullptr, as fast_hc_post gives them (the same bits), one launch fewer.
// With ye != nullptr (CudaRunOptions::defer_combine) y is the MoE combine of ye [T, K, dim] and ys
// [T, dim], computed as moe_combine does it (y not stored).
struct FastHcPost {
  const uint16_t* y = nullptr;
  const HcMix* mix = nullptr;
  uint16_t* X = nullptr;  // the site's X (the same array)
  float* pre_out = nullptr;
  const uint16_t* ye = nullptr;
  int K = 0;
  const uint16_t* ys = nullptr;
};

// True when fast_hc_site handles this shape (hc <= 4: the (2 + hc) hc mixes fit one warp).
bool fast_hc_site_ok(int hc, int64_t dim, int64_t T);

// One mHC site of T rows, two launches (partial sums, then finish; fast_small.cu): mix[t] = hc_mixes(X[t]) (dots of the flattened row with fn,
// scaled by rsqrt(mean square + norm_eps), Sinkhorn) and u[t] = RMSNorm(bf16(sum_a pre[a] X_a), w)
// with its act_quant codes in q. pre (stride pre_stride floats per row) is the carried collapse
// weight, independent of this site's mixes (single-pass mHC). X is only read (but see post below).
Status fast_hc_site(const uint16_t* X, int64_t T, int hc, int64_t dim, const float* fn, float norm_eps, const float* scale, const float* base,
                    int iters, float hc_eps, const float* pre, int64_t pre_stride, const uint16_t* norm_w, const FastHcScratch& scratch,
                    HcMix* mix, uint16_t* u, const QuantBuf& q, cudaStream_t st, bool defer_sinkhorn = false, const FastHcPost* post = nullptr);
// post != nullptr: the previous site's hc_post runs first, inside the partial kernel (post->X ==
// X, updated in place). Its pre_out must not be this site's pre (pass the mix's pre instead).
// defer_sinkhorn (tests): the site's kernels leave mix untouched and its row sums in scratch.tot,
// and fast_hc_sinkhorn (on any stream ordered after the site, before the next site on this
// scratch) writes mix with the one-thread Sinkhorn: the reference the site's warp Sinkhorn must
// equal bit for bit (cuda_fast_small_test).
Status fast_hc_sinkhorn(const FastHcScratch& scratch, int64_t T, int hc, float norm_eps, const float* scale, const float* base, int iters,
                        float hc_eps, HcMix* mix, cudaStream_t st);

// hc_post in place: X[t, b] = bf16(post[b] y[t] + sum_a comb[a, b] X[t, a]) (X as the site read
// it), and pre_out[t, :] = mix[t].pre when pre_out != nullptr (the FFN site's hc_take_pre).
Status fast_hc_post(const uint16_t* y, uint16_t* X, int64_t T, int hc, int64_t dim, const HcMix* mix, float* pre_out, cudaStream_t st);

// y [M, n] = RMSNorm(x, w) (bf16) and q = act_quant(y). n % 32 == 0, 16-byte rows.
Status fast_norm_quant(const uint16_t* x, int64_t M, int64_t n, const uint16_t* w, float eps, uint16_t* y, const QuantBuf& q, cudaStream_t st);
// q = act_quant(x [M, K]). K % 32 == 0, 16-byte rows.
Status fast_act_quant(const uint16_t* x, int64_t M, int64_t K, const QuantBuf& q, cudaStream_t st);
// q = act_quant(bf16(swiglu(a, b) [x weight[m]])) (swiglu_quant's semantics). n % 32 == 0.
Status fast_swiglu_quant(const uint16_t* a, const uint16_t* b, int64_t M, int64_t n, float limit, const float* weight, const QuantBuf& q,
                         cudaStream_t st);

}  // namespace fb::cuda
