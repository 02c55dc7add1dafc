#include "cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "base/check.h"
#include "base/fmath.h"
#include "cpu/block_gemm_simd.h"
#include "model/selection.h"

namespace fb::cpu {

namespace {

// e4m3 / e2m1 decode tables (exact values).
struct Luts {
  float e4m3[256];
  float e2m1[16];
  Luts() {
    for (int i = 0; i < 256; ++i) e4m3[i] = e4m3_to_f32(uint8_t(i));
    for (int i = 0; i < 16; ++i) e2m1[i] = e2m1_to_f32(uint8_t(i));
  }
};
const Luts& luts() {
  static const Luts l;
  return l;
}

// Rounds a positive f32 up to a power of two by its bit pattern (exact powers stay).
float pow2_ceil_bits(float t) {
  uint32_t u = bits_from_f32(t);
  int e = int((u >> 23) & 0xFF);
  uint32_t m = u & 0x7FFFFF;
  int k = e - 127 + (m != 0 ? 1 : 0);
  return std::ldexp(1.0f, k);
}

constexpr uint32_t kInv448Bits = 0x3B124925;  // f32(1/448)
constexpr uint32_t kInv6Bits = 0x3E2AAAAB;    // f32(1/6)

}  // namespace

float fp8_block_scale(float amax) {
  amax = std::max(amax, 1e-4f);
  return pow2_ceil_bits(amax * f32_from_bits(kInv448Bits));
}

void act_quant_row(const bf16_t* x, int64_t K, uint8_t* codes, float* scales) {
  FB_CHECK(K % 32 == 0) << "act_quant needs K % 32 == 0, K=" << K;
  for (int64_t b = 0; b < K / 32; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(bf(x[b * 32 + i])));
    const float s = fp8_block_scale(amax);
    scales[b] = s;
    for (int i = 0; i < 32; ++i) {
      float v = bf(x[b * 32 + i]) / s;  // exact: s is a power of two
      v = std::min(std::max(v, -kE4M3Max), kE4M3Max);
      codes[b * 32 + i] = e4m3_from_f32(v);
    }
  }
}

void fp8_qdq_row(const bf16_t* x, int64_t K, uint8_t* codes, uint8_t* scales_e8m0, bf16_t* out) {
  std::vector<float> s(static_cast<size_t>(K / 32));
  act_quant_row(x, K, codes, s.data());
  for (int64_t b = 0; b < K / 32; ++b) scales_e8m0[b] = e8m0_from_pow2(s[size_t(b)]);
  if (out) fp8_dequant_row(codes, scales_e8m0, K, out);
}

void fp8_dequant_row(const uint8_t* codes, const uint8_t* scales_e8m0, int64_t K, bf16_t* out) {
  const Luts& L = luts();
  for (int64_t b = 0; b < K / 32; ++b) {
    const float s = e8m0_to_f32(scales_e8m0[b]);
    for (int i = 0; i < 32; ++i) out[b * 32 + i] = to_bf(L.e4m3[codes[b * 32 + i]] * s);  // exact
  }
}

void fp4_e8m0_qdq_row(const bf16_t* x, int64_t K, uint8_t* packed, uint8_t* scales_e8m0, bf16_t* out) {
  FB_CHECK(K % 32 == 0);
  const float floor_amax = 6.0f * std::ldexp(1.0f, -126);
  for (int64_t b = 0; b < K / 32; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(bf(x[b * 32 + i])));
    amax = std::max(amax, floor_amax);
    const float s = pow2_ceil_bits(amax * f32_from_bits(kInv6Bits));
    scales_e8m0[b] = e8m0_from_pow2(s);
    for (int i = 0; i < 32; i += 2) {
      float v0 = std::min(std::max(bf(x[b * 32 + i]) / s, -6.0f), 6.0f);
      float v1 = std::min(std::max(bf(x[b * 32 + i + 1]) / s, -6.0f), 6.0f);
      packed[(b * 32 + i) / 2] = uint8_t(e2m1_from_f32(v0) | (e2m1_from_f32(v1) << 4));
    }
  }
  if (out) fp4_e8m0_dequant_row(packed, scales_e8m0, K, out);
}

void fp4_e8m0_dequant_row(const uint8_t* packed, const uint8_t* scales_e8m0, int64_t K, bf16_t* out) {
  const Luts& L = luts();
  for (int64_t i = 0; i < K; ++i) out[i] = to_bf(L.e2m1[e2m1_code_at(packed, i)] * e8m0_to_f32(scales_e8m0[i / 32]));
}

void fp4_e4m3_qdq_row(const bf16_t* x, int64_t K, uint8_t* packed, uint8_t* scales_e4m3, bf16_t* out) {
  FB_CHECK(K % 16 == 0);
  const float floor_amax = 6.0f * std::ldexp(1.0f, -9);
  const Luts& L = luts();
  for (int64_t b = 0; b < K / 16; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(bf(x[b * 16 + i])));
    amax = std::max(amax, floor_amax);
    const uint8_t sc = e4m3_from_f32(amax / 6.0f);  // true division, saturating RNE
    scales_e4m3[b] = sc;
    const float s = L.e4m3[sc];
    for (int i = 0; i < 16; i += 2) {
      float v0 = std::min(std::max(bf(x[b * 16 + i]) / s, -6.0f), 6.0f);  // IEEE division
      float v1 = std::min(std::max(bf(x[b * 16 + i + 1]) / s, -6.0f), 6.0f);
      packed[(b * 16 + i) / 2] = uint8_t(e2m1_from_f32(v0) | (e2m1_from_f32(v1) << 4));
    }
  }
  if (out) fp4_e4m3_dequant_row(packed, scales_e4m3, K, out);
}

void fp4_e4m3_dequant_row(const uint8_t* packed, const uint8_t* scales_e4m3, int64_t K, bf16_t* out) {
  const Luts& L = luts();
  for (int64_t i = 0; i < K; ++i) out[i] = to_bf(L.e2m1[e2m1_code_at(packed, i)] * L.e4m3[scales_e4m3[i / 16]]);
}

// ---- GEMMs ------------------------------------------------------------------------------------

namespace {

// One row's act_quant (spec/11 §2) for the block-scaled GEMMs: the e4m3 codes widened to f32
// through the table, and the per-32 scales.
struct QuantRow {
  std::vector<uint8_t> codes;
  std::vector<float> values, scales;
  explicit QuantRow(int64_t K) : codes(static_cast<size_t>(K)), values(static_cast<size_t>(K)), scales(static_cast<size_t>(K / 32)) {}
  void set(const bf16_t* x, const Luts& L) {
    const int64_t K = int64_t(codes.size());
    act_quant_row(x, K, codes.data(), scales.data());
    for (int64_t k = 0; k < K; ++k) values[size_t(k)] = L.e4m3[codes[size_t(k)]];
  }
};

// y [M, N] = act_quant(x) . W for a block-scaled weight (spec/11 §1.3): `weight(n, k)` is the
// exact f32 value of element (n, k) before its scale, `scale(n, b)` the e8m0 byte of row n's block
// b; 32-term block dots in blocks16 order, one bf16 rounding.
template <typename WeightAt, typename ScaleAt>
void block_scaled_gemm(const bf16_t* x, int64_t M, int64_t N, int64_t K, WeightAt weight, ScaleAt scale, bf16_t* y) {
  const int64_t KB = K / 32;
  const Luts& L = luts();
  QuantRow q(K);
  const std::vector<float>& qv = q.values;
  const std::vector<float>& qs = q.scales;
  for (int64_t m = 0; m < M; ++m) {
    q.set(x + m * K, L);
    for (int64_t n = 0; n < N; ++n) {
      const float acc = fm::blocks16_sum(
          KB, [&](int64_t k) { return fm::mul(qv[size_t(k)], weight(n, k)); },
          [&](int64_t b) { return fm::mul(qs[size_t(b)], e8m0_to_f32(scale(n, b))); });
      y[m * N + n] = to_bf(acc);
    }
  }
}

// block_scaled_gemm by the vector kernels (block_gemm_simd.h): the same quantised row, the same
// bits; rows(q, y_row) computes one output row of N values.
template <typename Rows>
void simd_block_gemm(const bf16_t* x, int64_t M, int64_t N, int64_t K, Rows rows, bf16_t* y) {
  const Luts& L = luts();
  QuantRow q(K);
  simd::QuantRowT qt;
  for (int64_t m = 0; m < M; ++m) {
    q.set(x + m * K, L);
    qt.set(q.values.data(), q.scales.data(), K);
    rows(qt, y + m * N);
  }
}

}  // namespace

void fp8_gemm(const bf16_t* x, int64_t M, const TensorView& w, const TensorView& w_scale, bf16_t* y) {
  FB_CHECK(w.dtype == DType::kF8E4M3 && w.rank() == 2);
  const int64_t N = w.dim(0), K = w.dim(1), KB = K / 32;
  FB_CHECK(K % 32 == 0 && w_scale.dim(0) == (N + 31) / 32 && w_scale.dim(1) == KB) << "fp8 gemm scale shape";
  const Luts& L = luts();
  const uint8_t* W = w.data;
  const uint8_t* S = w_scale.data;  // one scale per 32x32 block
  if (simd::enabled()) return simd_block_gemm(x, M, N, K, [&](const simd::QuantRowT& q, uint16_t* yr) { simd::fp8_rows(q, W, S, 0, N, yr); }, y);
  block_scaled_gemm(
      x, M, N, K, [&](int64_t n, int64_t k) { return L.e4m3[W[n * K + k]]; }, [&](int64_t n, int64_t b) { return S[(n / 32) * KB + b]; },
      y);
}

void fp4_gemm(const bf16_t* x, int64_t M, const TensorView& w, const TensorView& w_scale, bf16_t* y) {
  FB_CHECK(w.rank() == 2 && dtype_size(w.dtype) == 1);
  const int64_t N = w.dim(0), K = w.dim(1) * 2, KB = K / 32;
  FB_CHECK(w_scale.dim(0) == N && w_scale.dim(1) == KB) << "fp4 gemm scale shape";
  const Luts& L = luts();
  const uint8_t* W = w.data;        // packed e2m1 [N, K/2]
  const uint8_t* S = w_scale.data;  // one scale per row and 32 elements
  if (simd::enabled()) return simd_block_gemm(x, M, N, K, [&](const simd::QuantRowT& q, uint16_t* yr) { simd::fp4_rows(q, W, S, 0, N, yr); }, y);
  block_scaled_gemm(
      x, M, N, K, [&](int64_t n, int64_t k) { return L.e2m1[e2m1_code_at(W + n * (K / 2), k)]; },
      [&](int64_t n, int64_t b) { return S[n * KB + b]; }, y);
}

void bf16_gemm(const bf16_t* x, int64_t M, int64_t K, const bf16_t* w, int64_t N, bf16_t* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      y[m * N + n] = to_bf(fm::lanes32_sum(K, [&](int64_t k) { return fm::mul(bf(x[m * K + k]), bf(w[n * K + k])); }));
}

void f32_gemm_bf16w(const float* x, int64_t M, int64_t K, const bf16_t* w, int64_t N, float* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n)
      y[m * N + n] = fm::lanes32_sum(K, [&](int64_t k) { return fm::mul(x[m * K + k], bf(w[n * K + k])); });
}

void f32_gemm(const float* x, int64_t M, int64_t K, const float* w, int64_t N, float* y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) y[m * N + n] = fm::lanes32_sum(K, [&](int64_t k) { return fm::mul(x[m * K + k], w[n * K + k]); });
}

// ---- norms, RoPE --------------------------------------------------------------------------------

void rms_norm(const bf16_t* x, int64_t n, const bf16_t* w, float eps, bf16_t* y) {
  const float ss = fm::lanes32_sum(n, [&](int64_t i) { return fm::mul(bf(x[i]), bf(x[i])); });
  const float r = fm::rsqrt(fm::add(fm::div(ss, float(n)), eps));
  for (int64_t i = 0; i < n; ++i) y[i] = to_bf(fm::mul(bf(w[i]), fm::mul(bf(x[i]), r)));
}

void apply_rope(bf16_t* x, int64_t width, const model::RopeTable& t, int64_t pos, bool inverse) {
  const int half = t.rope_dim / 2;
  float c[256], s[256];
  FB_CHECK(half <= 256);
  t.at(pos, c, s);
  bf16_t* r = x + (width - t.rope_dim);
  for (int i = 0; i < half; ++i) {
    const float a = bf(r[2 * i]), b = bf(r[2 * i + 1]);
    if (!inverse) {
      r[2 * i] = to_bf(fm::add(fm::mul(a, c[i]), -fm::mul(b, s[i])));
      r[2 * i + 1] = to_bf(fm::add(fm::mul(a, s[i]), fm::mul(b, c[i])));
    } else {
      r[2 * i] = to_bf(fm::add(fm::mul(a, c[i]), fm::mul(b, s[i])));
      r[2 * i + 1] = to_bf(fm::add(fm::mul(b, c[i]), -fm::mul(a, s[i])));
    }
  }
}

// ---- sparse attention ---------------------------------------------------------------------------

void sparse_attention(const bf16_t* q, int n_heads, int d, const std::vector<const bf16_t*>& keys, const float* sinks, float scale,
                      bf16_t* out) {
  const size_t n = keys.size();
  std::vector<float> acc(static_cast<size_t>(d)), z(64), p(64);
  for (int h = 0; h < n_heads; ++h) {
    const bf16_t* qh = q + int64_t(h) * d;
    float m = -1e30f, l = 0.0f;
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (size_t b0 = 0; b0 < n; b0 += 64) {
      const size_t nb = std::min<size_t>(64, n - b0);
      float bmax = -INFINITY;
      for (size_t j = 0; j < nb; ++j) {
        const bf16_t* kv = keys[b0 + j];
        if (!kv) {
          z[j] = -INFINITY;
          continue;
        }
        const float dot = fm::lanes32_sum(d, [&](int64_t t) { return fm::mul(bf(qh[t]), bf(kv[t])); });
        z[j] = fm::mul(dot, scale);
        bmax = std::max(bmax, z[j]);
      }
      const float m2 = std::max(m, bmax);
      const float alpha = fm::exp(fm::add(m, -m2));
      float psum = 0.0f;
      for (size_t j = 0; j < nb; ++j) {
        p[j] = keys[b0 + j] ? fm::exp(fm::add(z[j], -m2)) : 0.0f;
        psum = fm::add(psum, p[j]);
      }
      l = fm::add(fm::mul(l, alpha), psum);
      for (int t = 0; t < d; ++t) {
        float s = 0.0f;
        for (size_t j = 0; j < nb; ++j)
          if (keys[b0 + j]) s = fm::add(s, fm::mul(round_bf16(p[j]), bf(keys[b0 + j][t])));
        acc[size_t(t)] = fm::add(fm::mul(acc[size_t(t)], alpha), s);
      }
      m = m2;
    }
    l = fm::add(l, fm::exp(fm::add(sinks[h], -m)));
    for (int t = 0; t < d; ++t) out[int64_t(h) * d + t] = to_bf(fm::div(acc[size_t(t)], l));
  }
}

// ---- candidate pool -----------------------------------------------------------------------------

std::vector<uint8_t> candidate_pool(const std::vector<float>& I, int64_t n_vis, int64_t block_size, int64_t topk_blocks) {
  const int64_t bs = block_size, n = int64_t(I.size());
  const int64_t nb = (n + bs - 1) / bs;
  std::vector<float> score(static_cast<size_t>(nb), -INFINITY);
  for (int64_t j = 0; j < n; ++j) score[size_t(j / bs)] = std::max(score[size_t(j / bs)], I[size_t(j)]);
  if (n_vis > 0) score[size_t((n_vis - 1) / bs)] = INFINITY;
  std::vector<int64_t> order(static_cast<size_t>(nb));
  std::iota(order.begin(), order.end(), 0);
  const int64_t keep = std::min<int64_t>(topk_blocks, nb);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int64_t a, int64_t b) {
    if (score[size_t(a)] != score[size_t(b)]) return score[size_t(a)] > score[size_t(b)];
    return a < b;
  });
  std::vector<uint8_t> mask(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < keep; ++i) {
    const int64_t b = order[size_t(i)];
    if (score[size_t(b)] == -INFINITY) continue;
    for (int64_t j = b * bs; j < std::min(n, (b + 1) * bs); ++j) mask[size_t(j)] = 1;
  }
  return mask;
}

// ---- mHC ----------------------------------------------------------------------------------------

void hc_mixes_raw(const bf16_t* x, int hc, int64_t dim, const float* fn, float norm_eps, float* mixes) {
  const int64_t n = hc * dim;
  const int n_mix = (2 + hc) * hc;
  const float ss = fm::lanes32_sum(n, [&](int64_t c) { return fm::mul(bf(x[c]), bf(x[c])); });
  const float rho = fm::rsqrt(fm::add(fm::div(ss, float(n)), norm_eps));
  for (int j = 0; j < n_mix; ++j) {
    const float* f = fn + int64_t(j) * n;
    mixes[j] = fm::mul(fm::lanes32_sum(n, [&](int64_t c) { return fm::mul(f[c], bf(x[c])); }), rho);
  }
}


void hc_pre(const bf16_t* x, int hc, int64_t dim, const float* pre, bf16_t* y) {
  for (int64_t d = 0; d < dim; ++d) {
    float s = 0.0f;
    for (int a = 0; a < hc; ++a) s = fm::add(s, fm::mul(pre[a], bf(x[a * dim + d])));
    y[d] = to_bf(s);
  }
}

void hc_post(const bf16_t* y, const bf16_t* x, int hc, int64_t dim, const model::HcMix& mix, bf16_t* out) {
  for (int b = 0; b < hc; ++b)
    for (int64_t d = 0; d < dim; ++d) {
      float s = 0.0f;
      for (int a = 0; a < hc; ++a) s = fm::add(s, fm::mul(mix.comb[a * hc + b], bf(x[a * dim + d])));
      out[b * dim + d] = to_bf(fm::add(fm::mul(mix.post[b], bf(y[d])), s));
    }
}

// ---- router -------------------------------------------------------------------------------------

std::vector<int> prefer_resident(const std::vector<int>& topk, const float* biased, int64_t n_experts, const RoutePreference& p, int* swaps) {
  std::vector<int> set = topk;
  if (swaps) *swaps = 0;
  if (p.margin <= 0.0f || !p.resident) return set;
  const auto higher = [&](int a, int b) {
    if (biased[a] != biased[b]) return biased[a] > biased[b];
    return a < b;
  };
  std::vector<char> chosen(size_t(n_experts), 0);
  for (int e : set) chosen[size_t(e)] = 1;
  std::vector<int> cand;  // unchosen resident experts, best first
  for (int64_t e = 0; e < n_experts; ++e)
    if (!chosen[size_t(e)] && p.resident(int(e))) cand.push_back(int(e));
  std::sort(cand.begin(), cand.end(), higher);
  size_t next = 0;
  // the weakest chosen expert first: the best candidate replaces it when within the margin; a
  // stronger chosen expert cannot be nearer to a candidate no better than this one
  for (size_t i = set.size(); i-- > 0 && next < cand.size();) {
    const int e = set[i];
    if (p.resident(e)) continue;
    const int c = cand[next];
    if (biased[c] < biased[e] - p.margin) break;
    set[i] = c;
    ++next;
    if (swaps) ++*swaps;
  }
  std::sort(set.begin(), set.end(), higher);
  return set;
}

Routing route(const bf16_t* u, int64_t dim, const TensorView& gate_w, const float* bias, int top_k, float gate_temp, bool norm_topk,
              float route_scale, const RoutePreference* prefer) {
  const int64_t E = gate_w.dim(0);
  const bf16_t* W = gate_w.as<bf16_t>();
  std::vector<float> score(static_cast<size_t>(E)), biased(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    float z = fm::lanes32_sum(dim, [&](int64_t k) { return fm::mul(bf(u[k]), bf(W[e * dim + k])); });
    z = fm::div(z, gate_temp);
    score[size_t(e)] = fm::sqrt_rn(fm::softplus(z));
    biased[size_t(e)] = fm::add(score[size_t(e)], bias[e]);
  }
  std::vector<int> idx(static_cast<size_t>(E));
  std::iota(idx.begin(), idx.end(), 0);
  // Sorted top-k, descending; exact ties toward the lower expert id (spec/11 §10).
  std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(), [&](int a, int b) {
    if (biased[size_t(a)] != biased[size_t(b)]) return biased[size_t(a)] > biased[size_t(b)];
    return a < b;
  });
  Routing r;
  r.margin = model::selection_margin(biased.data(), E, top_k);
  r.experts.assign(idx.begin(), idx.begin() + top_k);
  if (prefer) r.experts = prefer_resident(r.experts, biased.data(), E, *prefer, &r.swaps);
  float sum = 0.0f;
  for (int e : r.experts) {
    r.weights.push_back(score[size_t(e)]);
    sum = fm::add(sum, score[size_t(e)]);
  }
  if (norm_topk && top_k > 1)
    for (float& w : r.weights) w = fm::div(w, fm::add(sum, 1e-20f));
  for (float& w : r.weights) w = fm::mul(w, route_scale);
  return r;
}

void swiglu_row(const bf16_t* a, const bf16_t* b, int64_t n, float limit, float weight, bool apply_weight, bf16_t* h) {
  for (int64_t i = 0; i < n; ++i) {
    float av = bf(a[i]), bv = bf(b[i]);
    if (limit > 0.0f) {
      bv = std::min(std::max(bv, -limit), limit);
      av = std::min(av, limit);
    }
    float v = fm::mul(fm::silu(av), bv);
    if (apply_weight) v = fm::mul(v, weight);
    h[i] = to_bf(v);
  }
}

}  // namespace fb::cpu
