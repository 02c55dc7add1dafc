// Private to the CPU executor (included by executor.cpp and draft.cpp only): CpuLayerOps, the
// sublayer ops shared by the backbone step (executor.cpp, CpuStep) and the DSpark draft step
// (draft.cpp, CpuDraftStep). The CUDA executor mirrors the split (cuda/layer_ops.h).
#pragma once
#include "cpu/executor.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "base/fmath.h"
#include "base/mapped_file.h"
#include "base/thread_pool.h"
#include "cpu/block_gemm_simd.h"
#include "loader/bind.h"
#include "model/forward.h"
#include "model/selection.h"
#include "vision/span.h"
#include "vision/tower.h"

namespace fb::cpu {

using model::Config;
using model::LayerRole;
using model::Row;
using model::RowKind;
using model::Site;
inline const float* f32p(const TensorView& t) { return t.as<float>(); }
inline const bf16_t* bfp(const TensorView& t) { return t.as<bf16_t>(); }


// ---------------------------------------------------------------------------------------------
// Sublayer ops shared by the backbone and the draft: everything but embedding, attention keys
// and the head. Activations are [rows, ...] arrays; each row carries its position.
class CpuLayerOps {
 public:
  CpuLayerOps(const CpuModel& m, int64_t n_rows) : m_(m), c_(m.cfg_), T_(n_rows) {
    const int64_t D = c_.dim, hc = c_.hc_mult;
    X_.assign(size_t(T_ * hc * D), 0);
    pre_.assign(size_t(T_ * hc), 0.0f);
    mix_a_.resize(size_t(T_));
    mix_f_.resize(size_t(T_));
    u_.assign(size_t(T_ * D), 0);
    y_.assign(size_t(T_ * D), 0);
    qr_.assign(size_t(T_ * c_.q_lora_rank), 0);
    q_.assign(size_t(T_ * c_.q_dim()), 0);
    kv_.assign(size_t(T_ * c_.head_dim), 0);
    kv_codes_.assign(size_t(T_ * (c_.head_dim + c_.head_dim / 32)), 0);
    o_.assign(size_t(T_ * c_.q_dim()), 0);
    pos_.assign(size_t(T_), 0);
    image_.assign(size_t(T_), 0);
    rows_.resize(size_t(T_));
    std::iota(rows_.begin(), rows_.end(), int64_t(0));
  }

  // Detailed taps (debugging divergences); no effect on arithmetic.
  void record(const std::string& key, const std::vector<bf16_t>& v) {
    if (!detail_) return;
    std::vector<float>& out = detail_->named[key];
    out.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = bf(v[i]);
  }
  void record_f(const std::string& key, std::vector<float> v) {
    if (detail_) detail_->named[key] = std::move(v);
  }
  std::string L(int l, const char* what) const { return "L" + std::to_string(l) + "." + what; }
  static std::vector<float> to_f32(const std::vector<bf16_t>& v) {
    std::vector<float> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = bf(v[i]);
    return out;
  }

  void hc_mixes(int l, Site site) {
    if (site == Site::kAttn && probe_ && l < c_.n_layers) {
      // Layer gate: what the Engram module made of its (injected) input, then the block input.
      if (c_.roles[size_t(l)].engram_table >= 0) probe_->blocks[l].engram_out = to_f32(X_);
      if (probe_->inject_x.count(l)) {
        const auto& x = probe_->inject_x.at(l);
        const auto& p = probe_->inject_pre.at(l);
        FB_CHECK_EQ(x.size(), X_.size());
        FB_CHECK_EQ(p.size(), pre_.size());
        for (size_t i = 0; i < x.size(); ++i) X_[i] = to_bf(x[i]);
        pre_ = p;
      }
    }
    const auto& w = m_.w_.layers[size_t(l)];
    const TensorView& fn = site == Site::kAttn ? w.hc_attn_fn : w.hc_ffn_fn;
    const TensorView& base = site == Site::kAttn ? w.hc_attn_base : w.hc_ffn_base;
    const TensorView& scale = site == Site::kAttn ? w.hc_attn_scale : w.hc_ffn_scale;
    auto& mix = site == Site::kAttn ? mix_a_ : mix_f_;
    const int hc = c_.hc_mult, n_mix = (2 + hc) * hc;
    for_rows([&](int64_t t) {
      float m[16 * 24];
      hc_mixes_raw(stream(t), hc, c_.dim, f32p(fn), c_.norm_eps, m);
      (void)n_mix;
      model::hc_split_sinkhorn(m, hc, f32p(scale), f32p(base), c_.hc_sinkhorn_iters, c_.hc_eps, &mix[size_t(t)]);
    });
    if (site == Site::kAttn) residual_ = X_;  // R of spec/11 §3
  }

  // u = RMSNorm(hc_pre(X, pre), norm). The attention site collapses with the carried pre (the
  // previous sublayer's), the FFN site with the attention site's pre.
  void hc_collapse_norm(int l, Site site) {
    const auto& w = m_.w_.layers[size_t(l)];
    const int hc = c_.hc_mult;
    const int64_t D = c_.dim;
    if (site == Site::kFfn) residual_ = X_;
    for_rows([&](int64_t t) {
      std::vector<bf16_t> h(static_cast<size_t>(D));
      const float* pre = site == Site::kAttn ? &pre_[size_t(t * hc)] : mix_a_[size_t(t)].pre;
      hc_pre(stream(t), hc, D, pre, h.data());
      rms_norm(h.data(), D, bfp(site == Site::kAttn ? w.attn_norm : w.ffn_norm), c_.norm_eps, &u_[size_t(t * D)]);
    });
    record(L(l, site == Site::kAttn ? "attn_norm" : "ffn_norm"), u_);
  }

  void attn_q(int l) {
    const auto& w = m_.w_.layers[size_t(l)];
    const model::RopeTable& rope = rope_for(l);
    const int64_t QR = c_.q_lora_rank, QD = c_.q_dim();
    for_rows([&](int64_t t) {
      std::vector<bf16_t> a(static_cast<size_t>(QR));
      fp8_gemm(&u_[size_t(t * c_.dim)], 1, w.wq_a.w, w.wq_a.scale, a.data());
      rms_norm(a.data(), QR, bfp(w.q_norm), c_.norm_eps, &qr_[size_t(t * QR)]);
      fp8_gemm(&qr_[size_t(t * QR)], 1, w.wq_b.w, w.wq_b.scale, &q_[size_t(t * QD)]);
      for (int h = 0; h < c_.n_heads; ++h) apply_rope(&q_[size_t(t * QD + h * c_.head_dim)], c_.head_dim, rope, pos_[size_t(t)], false);
    });
    record(L(l, "qr"), qr_);
    record(L(l, "q"), q_);
  }

  // Window latent: kv_norm(wkv u), RoPE at the row's position, FP8 QDQ (compact codes kept).
  void attn_kv(int l) {
    const auto& w = m_.w_.layers[size_t(l)];
    const model::RopeTable& rope = rope_for(l);
    const int64_t hd = c_.head_dim, rb = hd + hd / 32;
    for_rows([&](int64_t t) {
      std::vector<bf16_t> a(static_cast<size_t>(hd));
      fp8_gemm(&u_[size_t(t * c_.dim)], 1, w.wkv.w, w.wkv.scale, a.data());
      rms_norm(a.data(), hd, bfp(w.kv_norm), c_.norm_eps, &kv_[size_t(t * hd)]);
      apply_rope(&kv_[size_t(t * hd)], hd, rope, pos_[size_t(t)], false);
      uint8_t* code = &kv_codes_[size_t(t * rb)];
      fp8_qdq_row(&kv_[size_t(t * hd)], hd, code, code + hd, &kv_[size_t(t * hd)]);
    });
    record(L(l, "kv"), kv_);
  }

  // o (attention output) -> inverse RoPE -> grouped wo_a (BF16, no act_quant) -> wo_b (FP8).
  void attn_output(int l) {
    record(L(l, "attn_o"), o_);
    const auto& w = m_.w_.layers[size_t(l)];
    const model::RopeTable& rope = rope_for(l);
    const int64_t QD = c_.q_dim(), G = c_.o_groups, OR = c_.o_lora_rank, GI = c_.o_group_in();
    const std::vector<bf16_t>& wa = m_.wo_a_bf16_[size_t(l)];
    for_rows([&](int64_t t) {
      bf16_t* o = &o_[size_t(t * QD)];
      for (int h = 0; h < c_.n_heads; ++h) apply_rope(o + h * c_.head_dim, c_.head_dim, rope, pos_[size_t(t)], true);
      std::vector<bf16_t> z(static_cast<size_t>(G * OR));
      for (int64_t g = 0; g < G; ++g) bf16_gemm(o + g * GI, 1, GI, &wa[size_t(g * OR * GI)], OR, &z[size_t(g * OR)]);
      fp8_gemm(z.data(), 1, w.wo_b.w, w.wo_b.scale, &y_[size_t(t * c_.dim)]);
    });
    record(L(l, "attn_out"), y_);
    if (probe_ && l < c_.n_layers) {
      auto& b = probe_->blocks[l];
      b.attn_out = to_f32(y_);
      b.attn_margin = attn_margin_.empty() ? std::vector<float>(size_t(T_), INFINITY) : attn_margin_;
    }
  }

  void hc_expand(int l, Site site) {
    (void)l;
    const auto& mix = site == Site::kAttn ? mix_a_ : mix_f_;
    const int hc = c_.hc_mult;
    for_rows([&](int64_t t) {
      hc_post(&y_[size_t(t * c_.dim)], &residual_[size_t(t * hc * c_.dim)], hc, c_.dim, mix[size_t(t)], stream(t));
      if (site == Site::kFfn)
        for (int i = 0; i < hc; ++i) pre_[size_t(t * hc + i)] = mix[size_t(t)].pre[i];
    });
  }

  // MoE (spec/11 §5): route, routed experts (weight before the down projection), shared expert,
  // f32 fold of bf16 expert outputs in ascending expert id, shared last, one rounding.
  void moe(int l) {
    const auto& w = m_.w_.layers[size_t(l)];
    const LayerRole& r = c_.roles[size_t(l)];
    const int64_t D = c_.dim, I = c_.moe_inter_dim;
    std::vector<float> router_margin(size_t(T_), INFINITY);
    // Route every row first, so a tiered expert source can start reading the layer's experts
    // (prefetch) before the first one is needed.
    std::vector<Routing> routes(static_cast<size_t>(T_));
    for_rows([&](int64_t t) {
      const TensorView& bias = (image_[size_t(t)] && w.gate_bias_vl.valid()) ? w.gate_bias_vl : w.gate_bias;
      RoutePreference pref;
      const bool prefer = m_.route_margin_ > 0.0f && m_.route_resident_;
      if (prefer) {
        pref.margin = m_.route_margin_;
        pref.resident = [&](int e) { return m_.route_resident_(l, e); };
      }
      routes[size_t(t)] = route(&u_[size_t(t * D)], D, w.gate_w, f32p(bias), r.n_active, c_.gate_temp, c_.norm_topk_prob, c_.route_scale,
                                prefer ? &pref : nullptr);
      if (routes[size_t(t)].swaps) m_.route_swaps_.fetch_add(routes[size_t(t)].swaps);
    });
    if (guess_layer_ == l) {  // how many of this layer's picks the layer before it guessed
      int64_t picks = 0, guessed = 0;
      for (int64_t t : rows_)
        for (int e : routes[size_t(t)].experts) {
          const std::vector<int>& g = guess_rows_[size_t(t)];
          ++picks;
          guessed += std::find(g.begin(), g.end(), e) != g.end();
        }
      m_.predict_recall_->picks.fetch_add(picks);
      m_.predict_recall_->guessed.fetch_add(guessed);
      guess_layer_ = -1;
    }
    {
      std::vector<int> picked;
      for (int64_t t : rows_) picked.insert(picked.end(), routes[size_t(t)].experts.begin(), routes[size_t(t)].experts.end());
      std::sort(picked.begin(), picked.end());
      picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
      m_.experts_->prefetch(l, picked);
    }
    for_rows([&](int64_t t) {
      const bf16_t* u = &u_[size_t(t * D)];
      const Routing& rt = routes[size_t(t)];
      router_margin[size_t(t)] = rt.margin;
      std::vector<std::pair<int, float>> picks;
      for (size_t k = 0; k < rt.experts.size(); ++k) picks.push_back({rt.experts[k], rt.weights[k]});
      std::sort(picks.begin(), picks.end());
      std::vector<bf16_t> a(static_cast<size_t>(I)), b(static_cast<size_t>(I)), h(static_cast<size_t>(I)), ye(static_cast<size_t>(D));
      std::vector<float> acc(static_cast<size_t>(D), 0.0f);
      for (auto [e, wt] : picks) {
        model::ExpertWeights ex = m_.experts_->expert(l, e);
        fp4_gemm(u, 1, ex.w1.w, ex.w1.scale, a.data());
        fp4_gemm(u, 1, ex.w3.w, ex.w3.scale, b.data());
        swiglu_row(a.data(), b.data(), I, c_.swiglu_limit, wt, true, h.data());
        fp4_gemm(h.data(), 1, ex.w2.w, ex.w2.scale, ye.data());
        for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += bf(ye[size_t(d)]);
      }
      fp8_gemm(u, 1, w.sh_w1.w, w.sh_w1.scale, a.data());
      fp8_gemm(u, 1, w.sh_w3.w, w.sh_w3.scale, b.data());
      swiglu_row(a.data(), b.data(), I, c_.swiglu_limit, 1.0f, false, h.data());
      fp8_gemm(h.data(), 1, w.sh_w2.w, w.sh_w2.scale, ye.data());
      for (int64_t d = 0; d < D; ++d) y_[size_t(t * D + d)] = to_bf(acc[size_t(d)] + bf(ye[size_t(d)]));
    });
    if (m_.expert_predict_ && l + 1 < c_.n_layers) predict_next(l + 1);
    record(L(l, "moe_out"), y_);
    if (probe_ && l < c_.n_layers) {
      auto& b = probe_->blocks[l];
      b.ffn_out = to_f32(y_);
      b.ffn_margin = router_margin;
      for (size_t t = 0; t < b.ffn_margin.size() && t < b.attn_margin.size(); ++t)
        b.ffn_margin[t] = std::min(b.ffn_margin[t], b.attn_margin[t]);
    }
  }

  // CpuModel::set_expert_predict: layer l2's gate on the current expert input u_, every row's
  // picks handed to the source's prefetch (after this layer's expert() calls: a tiered source keeps
  // the reads of the layer whose calls come next).
  void predict_next(int l2) {
    const auto& w = m_.w_.layers[size_t(l2)];
    const LayerRole& r = c_.roles[size_t(l2)];
    const int64_t D = c_.dim;
    std::vector<Routing> guess(static_cast<size_t>(T_));
    for_rows([&](int64_t t) {
      const TensorView& bias = (image_[size_t(t)] && w.gate_bias_vl.valid()) ? w.gate_bias_vl : w.gate_bias;
      guess[size_t(t)] = route(&u_[size_t(t * D)], D, w.gate_w, f32p(bias), r.n_active, c_.gate_temp, c_.norm_topk_prob, c_.route_scale, nullptr);
    });
    std::vector<int> picked;
    guess_rows_.assign(size_t(T_), {});
    for (int64_t t : rows_) {
      picked.insert(picked.end(), guess[size_t(t)].experts.begin(), guess[size_t(t)].experts.end());
      guess_rows_[size_t(t)] = guess[size_t(t)].experts;
    }
    guess_layer_ = l2;
    std::sort(picked.begin(), picked.end());
    picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
    m_.predict_recall_->hints.fetch_add(int64_t(picked.size()));
    m_.experts_->prefetch(l2, picked);
  }

 protected:
  // fn(t) for every row the ops currently run on (all rows, unless bounded-replay rows left).
  void for_rows(const std::function<void(int64_t)>& fn) const {
    parallel_for(0, int64_t(rows_.size()), [&](int64_t i) { fn(rows_[size_t(i)]); });
  }
  bf16_t* stream(int64_t t) { return &X_[size_t(t * c_.hc_mult * c_.dim)]; }
  const model::RopeTable& rope_for(int l) const { return c_.roles[size_t(l)].yarn() ? m_.rope_yarn_ : m_.rope_plain_; }
  void embed_rows(const std::vector<int32_t>& tokens, const std::vector<const bf16_t*>& given) {
    const int64_t D = c_.dim, hc = c_.hc_mult;
    for (int64_t t = 0; t < T_; ++t) {
      const bf16_t* e = given[size_t(t)] ? given[size_t(t)] : bfp(m_.w_.embed) + int64_t(tokens[size_t(t)]) * D;
      for (int64_t i = 0; i < hc; ++i) std::copy(e, e + D, stream(t) + i * D);
      for (int64_t i = 0; i < hc; ++i) pre_[size_t(t * hc + i)] = i == 0 ? 1.0f : 0.0f;
    }
  }
  // logits (f32) = f32(RMSNorm(hc_pre(X, pre), norm_w)) . f32(head)^T for one row.
  void head_row(int64_t t, const TensorView& norm_w, float* logits, bf16_t* collapsed) {
    const int64_t D = c_.dim;
    std::vector<bf16_t> h(static_cast<size_t>(D)), n(static_cast<size_t>(D));
    hc_pre(stream(t), c_.hc_mult, D, &pre_[size_t(t * c_.hc_mult)], h.data());
    if (collapsed) std::copy(h.begin(), h.end(), collapsed);
    rms_norm(h.data(), D, bfp(norm_w), c_.norm_eps, n.data());
    std::vector<float> nf(static_cast<size_t>(D));
    for (int64_t d = 0; d < D; ++d) nf[size_t(d)] = bf(n[size_t(d)]);
    const bf16_t* W = bfp(m_.w_.head);
    simd::Lanes32Row xr;  // the same sums by AVX-512 where there is one (block_gemm_simd.h)
    const bool vec = simd::enabled() && D % 8 == 0;
    if (vec) xr.set(nf.data(), D);
    parallel_for(0, (c_.vocab_size + 4095) / 4096, [&](int64_t blk) {
      const int64_t v1 = std::min<int64_t>(c_.vocab_size, (blk + 1) * 4096);
      for (int64_t v = blk * 4096; v < v1; ++v) {
        const bf16_t* wr = W + v * D;
        logits[v] = vec ? simd::lanes32_dot_bf16(xr, wr) : fm::lanes32_sum(D, [&](int64_t d) { return fm::mul(nf[size_t(d)], bf(wr[d])); });
      }
    });
  }

  const CpuModel& m_;
  const Config& c_;
  int64_t T_;
  std::vector<bf16_t> X_, residual_, u_, y_, qr_, q_, kv_, o_;
  std::vector<uint8_t> kv_codes_;
  std::vector<float> pre_;
  std::vector<model::HcMix> mix_a_, mix_f_;
  std::vector<int64_t> pos_;
  std::vector<uint8_t> image_;
  std::vector<int64_t> rows_;      // rows the ops run on, ascending (see CpuStep::leave_begin)
  // CpuModel::set_expert_predict: the guesses for layer guess_layer_'s routing, per row (its
  // own routing then counts how many of its picks were guessed).
  int guess_layer_ = -1;
  std::vector<std::vector<int>> guess_rows_;
  model::Taps* detail_ = nullptr;  // set when detailed taps are requested
  model::Taps* probe_ = nullptr;   // set for the layer gate (Taps::probe): injection and block outputs
  std::vector<float> attn_margin_;  // per row: selection margin of this layer's attention (probe only)
};

}  // namespace fb::cpu
