#include "cpu/executor.h"

#include <chrono>
#include <cstring>

#include "cpu/layer_ops.h"
#include "loader/bind.h"
#include "loader/read_in.h"
#include "model/engram_staging.h"
#include "model/fp8_weight.h"
#include "model/timed_ops.h"

namespace fb::cpu {

Result<std::unique_ptr<CpuModel>> CpuModel::load(const std::string& dir, std::vector<int32_t> token_map) {
  auto snap = FB_TRY(loader::Snapshot::open(dir));
  FB_RETURN_IF_ERROR(loader::check_runnable(*snap, &token_map));
  return std::make_unique<CpuModel>(std::move(snap), std::move(token_map));
}

CpuModel::CpuModel(std::unique_ptr<loader::Snapshot> snap, std::vector<int32_t> token_map)
    : snap_(std::move(snap)), cfg_(snap_->config()), w_(loader::bind_weights(*snap_)), token_map_(std::move(token_map)) {
  experts_ = std::make_shared<loader::SnapshotExperts>(*snap_);
  const Config& c = cfg_;
  if (!c.engram_layer_ids.empty()) {
    engram_ = model::engram_constants(c.engram_layer_ids, c.engram_vocab_size, c.engram_max_ngram, c.engram_n_heads,
                                      c.engram_compressed_vocab);
    pad_class_ = token_map_.at(size_t(c.engram_pad_id));
  }
  rope_plain_ = model::make_rope_table(c.rope_head_dim, c.rope_theta, false, 1.0, 0, c.beta_fast, c.beta_slow);
  rope_yarn_ = model::make_rope_table(c.rope_head_dim, c.compress_rope_theta, true, c.rope_factor, c.original_seq_len, c.beta_fast, c.beta_slow);
  // Model identity for serialized sessions (shared with the CUDA executor: states cross executors).
  model_id_ = loader::model_identity(*snap_);
  wo_a_bf16_.resize(size_t(c.n_total_layers()));
  for (int l = 0; l < c.n_total_layers(); ++l)
    wo_a_bf16_[size_t(l)] = model::dequant_fp8_weight(w_.layers[size_t(l)].wo_a.w, w_.layers[size_t(l)].wo_a.scale);
  for (const std::string& name : snap_->tensor_names()) {
    const uint64_t n = snap_->get(name).nbytes();
    weight_bytes_all_ += n;
    if (!loader::is_routed_expert_tensor(name)) weight_bytes_no_experts_ += n;
  }
}

void CpuModel::set_expert_source(std::shared_ptr<const model::ExpertSource> src) {
  experts_ = std::move(src);
  experts_tiered_ = dynamic_cast<const loader::SnapshotExperts*>(experts_.get()) == nullptr;
}

// ---------------------------------------------------------------------------------------------
// Backbone step over rows of one or more sessions.
class CpuStep : public CpuLayerOps {
 public:
  CpuStep(const CpuModel& m, const model::Step& step, const std::vector<SessionCache*>& sessions, Taps* taps)
      : CpuLayerOps(m, int64_t(step.rows.size())), step_(step), sessions_(sessions), taps_(taps) {
    if (taps && taps->enabled && taps->detailed) detail_ = taps;
    if (taps && taps->probe) probe_ = taps;
    for (int64_t t = 0; t < T_; ++t) {
      pos_[size_t(t)] = step.rows[size_t(t)].pos;
      image_[size_t(t)] = step.rows[size_t(t)].image;
    }
    first_row_.assign(sessions.size(), -1);
    for (int64_t t = 0; t < T_; ++t) {
      int s = step.rows[size_t(t)].session;
      if (first_row_[size_t(s)] < 0) first_row_[size_t(s)] = t;
    }
    const int n_taps = int(c_.dspark_target_layer_ids.size());
    out_.taps_first_row = std::clamp<int64_t>(step.taps_from_row, 0, T_);
    out_.taps.assign(size_t((T_ - out_.taps_first_row) * n_taps * c_.dim), 0);
    // Token history for Engram: the sessions' past plus this step's rows.
    for (int64_t t = 0; t < T_; ++t) {
      SessionCache* s = sessions_[size_t(step.rows[size_t(t)].session)];
      s->tokens.push_back(step.rows[size_t(t)].token);
      s->image.push_back(step.rows[size_t(t)].image ? 1 : 0);
    }
    for (int l = 0; l < c_.n_layers; ++l)
      if (c_.roles[size_t(l)].engram_table >= 0) engram_layers_.push_back(l);
  }

  // Engram rows counted into `rows` (CpuModel::stats; null: not counted).
  void count_engram(model::EngramRows* rows) { engram_count_ = rows; }

  model::StepOutput take_output() { return std::move(out_); }

  // Bounded replay (spec/11 §8.4), called by run_backbone at Config::decoder_start: the rows
  // below their replay_start become the only rows (false when there are none) ...
  bool leave_begin(int l) {
    (void)l;
    std::vector<int64_t> leaving, staying;
    for (int64_t t : rows_) {
      const Row& r = step_.rows[size_t(t)];
      (r.kind == RowKind::kPrefill && r.pos < r.replay_start ? leaving : staying).push_back(t);
    }
    if (leaving.empty()) return false;
    rows_ = std::move(leaving);
    staying_ = std::move(staying);
    return true;
  }
  // ... and after their compressor they leave. Their slots in the decoder rings are marked
  // empty, so those rings hold replayed positions only (never a stale row of a rolled-back
  // continuation); what a slot held before is older than any later query's window.
  void leave_end(int l) {
    for (int64_t t : rows_) {
      SessionCache* s = sessions_[size_t(step_.rows[size_t(t)].session)];
      for (int d = l; d < c_.n_layers; ++d) {
        Ring& ring = s->rings[size_t(d)];
        ring.pos[size_t(pos_[size_t(t)] % ring.slots)] = -1;
      }
    }
    rows_ = std::move(staying_);
    staying_.clear();
  }

  void embed() {
    std::vector<int32_t> tokens;
    std::vector<const bf16_t*> given;
    for (const Row& r : step_.rows) {
      tokens.push_back(r.token);
      given.push_back(r.embed_row >= 0 ? &step_.embeddings[size_t(r.embed_row) * size_t(c_.dim)] : nullptr);
    }
    embed_rows(tokens, given);
  }

  // spec/11 §6.3: per row and table, the 24 (orders x heads) row ids.
  void engram_hash() {
    if (m_.engram_.empty()) return;
    const int n_tab = int(m_.engram_.size()), n_ord = c_.engram_max_ngram - 1, H = c_.engram_n_heads;
    hashes_.assign(size_t(T_ * n_tab * n_ord * H), 0);
    for (int64_t t = 0; t < T_; ++t) {
      const Row& r = step_.rows[size_t(t)];
      const SessionCache* s = sessions_[size_t(r.session)];
      auto cls = [&](int64_t p) -> int64_t {  // class of position p, -1 = DEAD
        if (s->image[size_t(p)]) return -1;
        return m_.token_map_.at(size_t(s->tokens[size_t(p)]));
      };
      model::engram_row_ids(m_.engram_, c_.engram_max_ngram, H, m_.pad_class_, r.pos, cls, &hashes_[size_t(t * n_tab * n_ord * H)]);
    }
    start_engram_staging();
  }

  // MISSION item 7 on the CPU: every Engram layer's rows are known once the ids are hashed, so a
  // task copies them out of the mapped tables (page faults and drive reads included) layer after
  // layer while the layers before them run (model::EngramStaging, shared with the CUDA executor's
  // host tables); engram(l) reads the copies: the same bytes, the same numerics. Without the task
  // (CpuModel::set_engram_prefetch(false), or no thread to be had) engram(l) copies all its rows.
  void start_engram_staging() {
    std::vector<model::EngramStaging::Table> tabs;
    for (int l : engram_layers_) {
      const auto& w = m_.w_.layers[size_t(l)];
      tabs.push_back({w.engram_table.data, w.engram_table_scale.data, w.engram_table.dim(0), c_.roles[size_t(l)].engram_table,
                      m_.engram_source_.get(), l});
    }
    const Status st = m_.engram_staging_.start(std::move(tabs), hashes_.data(), T_, int(m_.engram_.size()),
                                            (c_.engram_max_ngram - 1) * c_.engram_n_heads, c_.engram_head_dim, m_.engram_prefetch_ ? 1 : 0);
    FB_CHECK(st.ok()) << st.to_string();
  }
  int engram_cols() const { return (c_.engram_max_ngram - 1) * c_.engram_n_heads; }
  // Before layer l's Engram op: its rows staged (counted as hidden or exposed).
  model::EngramStaging::Rows engram_rows_for(int l) {
    const size_t k = size_t(std::find(engram_layers_.begin(), engram_layers_.end(), l) - engram_layers_.begin());
    FB_CHECK(k < engram_layers_.size());
    const model::EngramStaging::Rows r = m_.engram_staging_.rows(k, engram_count_);
    // Every replica of a drive-backed table failed (storage::EngramRowCache failed over first):
    // the run cannot go on, as with a routed expert that no replica can supply.
    const Status st = m_.engram_staging_.status();
    FB_CHECK(st.ok()) << st.to_string();
    return r;
  }

  // spec/11 §6.4: gather + FP8 projection + per-stream gate, before block l.
  void engram(int l) {
    const auto& w = m_.w_.layers[size_t(l)];
    const int n_cols = engram_cols(), hd = c_.engram_head_dim, hc = c_.hc_mult;
    const model::EngramStaging::Rows staged = engram_rows_for(l);
    const int64_t D = c_.dim;
    const float inv_sqrt_d = float(1.0 / std::sqrt(double(D)));
    if (probe_ && probe_->inject_engram_in.count(l)) {
      const auto& x = probe_->inject_engram_in.at(l);
      FB_CHECK_EQ(x.size(), X_.size());
      for (size_t i = 0; i < x.size(); ++i) X_[i] = to_bf(x[i]);
    }
    for_rows([&](int64_t t) {
      std::vector<bf16_t> E(static_cast<size_t>(n_cols * hd));
      for (int col = 0; col < n_cols; ++col) {
        const int64_t i = t * n_cols + col;  // the table row's codes and scales, as staged
        fp8_dequant_row(staged.codes + i * hd, staged.scales + i * (hd / 32), hd, &E[size_t(col * hd)]);
      }
      std::vector<bf16_t> kv(static_cast<size_t>((1 + hc) * D));
      fp8_gemm(E.data(), 1, w.engram_wkv.w, w.engram_wkv.scale, kv.data());
      const bf16_t* V = &kv[size_t(hc * D)];
      bf16_t* x = stream(t);
      for (int i = 0; i < hc; ++i) {
        const bf16_t* K = &kv[size_t(i * D)];
        const bf16_t* qw = bfp(w.engram_q) + i * D;
        const bf16_t* kw = bfp(w.engram_k) + i * D;
        bf16_t* xi = x + i * D;
        const float hh = fm::lanes32_sum(D, [&](int64_t d) { return fm::mul(bf(xi[d]), bf(xi[d])); });
        const float kk = fm::lanes32_sum(D, [&](int64_t d) { return fm::mul(bf(K[d]), bf(K[d])); });
        float dot = fm::lanes32_sum(D, [&](int64_t d) {
          const float omega = fm::mul(bf(qw[d]), bf(kw[d]));  // q_weight * k_weight, as the reference
          return fm::mul(fm::mul(bf(xi[d]), omega), bf(K[d]));
        });
        const float rho = fm::mul(fm::rsqrt(fm::add(fm::div(hh, float(D)), c_.norm_eps)), fm::rsqrt(fm::add(fm::div(kk, float(D)), c_.norm_eps)));
        dot = fm::mul(fm::mul(dot, rho), inv_sqrt_d);
        float g = fm::sigmoid(std::copysign(fm::sqrt_rn(std::max(std::fabs(dot), 1e-6f)), dot));
        if (image_[size_t(t)]) g = 0.0f;
        for (int64_t d = 0; d < D; ++d) xi[d] = to_bf(fm::add(bf(xi[d]), fm::mul(g, bf(V[d]))));
      }
    });
  }

  void dspark_tap(int tap) {
    const int n_taps = int(c_.dspark_target_layer_ids.size()), hc = c_.hc_mult;
    const int64_t D = c_.dim;
    for (int64_t t : rows_) {
      if (t < out_.taps_first_row) continue;  // the caller does not read these (model::Step)
      const bf16_t* x = stream(t);
      bf16_t* out = &out_.taps[size_t(((t - out_.taps_first_row) * n_taps + tap) * D)];
      for (int64_t d = 0; d < D; ++d) {
        float s = 0.0f;
        for (int i = 0; i < hc; ++i) s = fm::add(s, bf(x[i * D + d]));
        out[d] = to_bf(fm::div(s, float(hc)));
      }
    }
  }

  // Compressor of a KV source (spec/11 §4.4-4.6, §4.9b): emits latents of completed groups,
  // appends compressed entries and index keys BEFORE any scoring of this step.
  void compress(int l) {
    const auto& w = m_.w_.layers[size_t(l)];
    const int ratio = c_.roles[size_t(l)].ratio;
    const int64_t D = c_.dim, hd = c_.head_dim, ihd = c_.index_head_dim;
    const model::RopeTable& rope = rope_for(l);
    // Per-row projections first (row-independent), then the sequential pooling per session.
    std::vector<float> kproj, gproj;
    std::vector<bf16_t> lat1;
    if (ratio == 2) {
      kproj.assign(size_t(T_ * hd), 0.0f);
      gproj.assign(size_t(T_ * hd), 0.0f);
      for_rows([&](int64_t t) {
        std::vector<float> uf(static_cast<size_t>(D));
        for (int64_t d = 0; d < D; ++d) uf[size_t(d)] = bf(u_[size_t(t * D + d)]);
        f32_gemm_bf16w(uf.data(), 1, D, bfp(w.comp_wkv), hd, &kproj[size_t(t * hd)]);
        f32_gemm_bf16w(uf.data(), 1, D, bfp(w.comp_wgate), hd, &gproj[size_t(t * hd)]);
      });
    } else {
      lat1.assign(size_t(T_ * hd), 0);
      for_rows([&](int64_t t) { bf16_gemm(&u_[size_t(t * D)], 1, D, bfp(w.comp_wkv), hd, &lat1[size_t(t * hd)]); });
    }
    std::vector<bf16_t> pooled(static_cast<size_t>(hd)), latent(static_cast<size_t>(hd)), key(static_cast<size_t>(ihd)),
        tmp(static_cast<size_t>(hd));
    for (int64_t t : rows_) {
      SessionCache* s = sessions_[size_t(step_.rows[size_t(t)].session)];
      CompressedCache& cc = s->comp[size_t(l)];
      const int64_t p = pos_[size_t(t)];
      if (ratio == 2) {
        float* slot = &cc.tail[size_t((p % kTailSlots) * 2 * hd)];
        cc.tail_pos[size_t(p % kTailSlots)] = p;
        std::copy(&kproj[size_t(t * hd)], &kproj[size_t(t * hd)] + hd, slot);
        std::copy(&gproj[size_t(t * hd)], &gproj[size_t(t * hd)] + hd, slot + hd);
        if (p % 2 == 0) continue;
        const float* k0 = &cc.tail[size_t(((p - 1) % kTailSlots) * 2 * hd)];
        const float* g0 = k0 + hd;
        const float* k1 = slot;
        const float* g1 = slot + hd;
        for (int64_t i = 0; i < hd; ++i) {
          const float mx = std::max(g0[i], g1[i]);
          const float ea = fm::exp(fm::add(g0[i], -mx)), eb = fm::exp(fm::add(g1[i], -mx));
          const float sum = fm::add(ea, eb);
          pooled[size_t(i)] = to_bf(fm::add(fm::mul(k0[i], fm::div(ea, sum)), fm::mul(k1[i], fm::div(eb, sum))));
        }
        rms_norm(pooled.data(), hd, bfp(w.comp_norm), c_.norm_eps, latent.data());
      } else {
        rms_norm(&lat1[size_t(t * hd)], hd, bfp(w.comp_norm), c_.norm_eps, latent.data());
      }
      const int64_t j = p / ratio, gpos = j * ratio;
      FB_CHECK_EQ(cc.n_entries(), j) << "compressed cache of layer " << l << " out of step";
      // index key from the PRE-RoPE latent
      bf16_gemm(latent.data(), 1, hd, bfp(w.idx_wk), ihd, tmp.data());
      rms_norm(tmp.data(), ihd, bfp(w.idx_k_norm), c_.norm_eps, key.data());
      apply_rope(key.data(), ihd, rope, gpos, false);
      cc.keys.resize(cc.keys.size() + size_t(cc.key_bytes));
      uint8_t* kb = cc.keys.data() + cc.keys.size() - size_t(cc.key_bytes);
      fp4_e8m0_qdq_row(key.data(), ihd, kb, kb + ihd / 2, nullptr);
      apply_rope(latent.data(), hd, rope, gpos, false);
      cc.kv.resize(cc.kv.size() + size_t(cc.kv_bytes));
      uint8_t* vb = cc.kv.data() + cc.kv.size() - size_t(cc.kv_bytes);
      fp4_e4m3_qdq_row(latent.data(), hd, vb, vb + hd / 2, nullptr);
    }
  }

  // Indexer (spec/11 §4.7-4.9): bf16 score chain, candidate pool, top-k selection per row.
  void index_select(int l) {
    const auto& w = m_.w_.layers[size_t(l)];
    const LayerRole& r = c_.roles[size_t(l)];
    const int ratio = r.ratio, IH = c_.index_n_heads, ihd = c_.index_head_dim;
    const int64_t D = c_.dim;
    const model::RopeTable& rope = rope_for(l);
    const float wscale = float(1.0 / std::sqrt(double(ihd)) / std::sqrt(double(IH)));
    auto& sel = selections_[l];
    sel.assign(size_t(T_), {});
    std::vector<std::vector<uint8_t>>* pool = r.candidate_source ? &pools_ : nullptr;
    if (pool) pool->assign(size_t(T_), {});
    if (probe_) {
      sel_margin_[l].assign(size_t(T_), INFINITY);
      if (r.candidate_source) pool_margin_.assign(size_t(T_), INFINITY);
      if (pool_margin_.empty()) pool_margin_.assign(size_t(T_), INFINITY);
    }
    std::vector<float>* selm = probe_ ? &sel_margin_[l] : nullptr;
    // Dequantised index keys of the KV source, per session.
    std::map<int, std::vector<bf16_t>> keys_of;
    for (size_t s = 0; s < sessions_.size(); ++s) {
      const CompressedCache& cc = sessions_[s]->comp[size_t(r.kv_layer)];
      std::vector<bf16_t>& k = keys_of[int(s)];
      k.resize(size_t(cc.n_entries() * ihd));
      for (int64_t j = 0; j < cc.n_entries(); ++j) {
        const uint8_t* kb = cc.keys.data() + j * cc.key_bytes;
        fp4_e8m0_dequant_row(kb, kb + ihd / 2, ihd, &k[size_t(j * ihd)]);
      }
    }
    for_rows([&](int64_t t) {
      const Row& row = step_.rows[size_t(t)];
      const int64_t p = row.pos;
      const int64_t n_vis = (p + 1) / ratio;
      const int64_t n_scored = row.kind == RowKind::kPrefill ? row.prefill_end / ratio : n_vis;
      const std::vector<bf16_t>& keys = keys_of[row.session];
      // queries
      std::vector<bf16_t> iq(static_cast<size_t>(IH * ihd)), wts(static_cast<size_t>(IH));
      fp8_gemm(&qr_[size_t(t * c_.q_lora_rank)], 1, w.idx_wq_b.w, w.idx_wq_b.scale, iq.data());
      std::vector<uint8_t> pk(static_cast<size_t>(ihd / 2)), ps(static_cast<size_t>(ihd / 32));
      for (int h = 0; h < IH; ++h) {
        apply_rope(&iq[size_t(h * ihd)], ihd, rope, p, false);
        fp4_e8m0_qdq_row(&iq[size_t(h * ihd)], ihd, pk.data(), ps.data(), &iq[size_t(h * ihd)]);
      }
      bf16_gemm(&u_[size_t(t * D)], 1, D, bfp(w.idx_weights_proj), IH, wts.data());
      for (int h = 0; h < IH; ++h) wts[size_t(h)] = to_bf(fm::mul(bf(wts[size_t(h)]), wscale));
      // scores over the scored slice; invisible entries -inf
      std::vector<float> I(static_cast<size_t>(n_scored), -INFINITY);
      for (int64_t j = 0; j < n_vis; ++j) {
        const bf16_t* kj = &keys[size_t(j * ihd)];
        float tot = 0.0f;
        for (int h = 0; h < IH; ++h) {
          const float d = fm::lanes32_sum(ihd, [&](int64_t i) { return fm::mul(bf(iq[size_t(h * ihd + i)]), bf(kj[i])); });
          const float db = std::max(round_bf16(d), 0.0f);
          tot = fm::add(tot, round_bf16(fm::mul(db, bf(wts[size_t(h)]))));
        }
        I[size_t(j)] = round_bf16(tot);
      }
      if (r.candidate_source) {
        (*pool)[size_t(t)] = candidate_pool(I, n_vis, c_.candidate_block_size, c_.candidate_topk_blocks);
        if (probe_) pool_margin_[size_t(t)] = model::pool_margin(I.data(), n_scored, n_vis, c_.candidate_block_size, c_.candidate_topk_blocks);
      }
      if (r.pool_restricted) {
        const std::vector<uint8_t>& mask = pools_[size_t(t)];
        for (int64_t j = 0; j < n_scored; ++j)
          if (j >= int64_t(mask.size()) || !mask[size_t(j)]) I[size_t(j)] = -INFINITY;
      }
      const int64_t k = std::min<int64_t>(c_.index_topk, n_scored);
      if (probe_) {
        float m = model::selection_margin(I.data(), n_scored, k);
        if (r.pool_restricted) m = std::min(m, pool_margin_[size_t(t)]);
        (*selm)[size_t(t)] = m;
      }
      std::vector<int32_t> ids(static_cast<size_t>(n_scored));
      std::iota(ids.begin(), ids.end(), 0);
      std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
        if (I[size_t(a)] != I[size_t(b)]) return I[size_t(a)] > I[size_t(b)];
        return a < b;  // exact ties toward the lower index (spec/11 §10)
      });
      ids.resize(size_t(k));
      std::sort(ids.begin(), ids.end());
      for (int32_t& id : ids)
        if (id >= n_vis) id = -1;  // positional validity (spec/11 §4.9)
      sel[size_t(t)] = std::move(ids);
    });
    if (detail_) {
      std::vector<float> flat;
      for (auto& v : sel)
        for (int32_t id : v) flat.push_back(float(id));
      record_f(L(l, "sel"), std::move(flat));
    }
  }

  void attention(int l) {
    const auto& w = m_.w_.layers[size_t(l)];
    const LayerRole& r = c_.roles[size_t(l)];
    const int64_t hd = c_.head_dim, W = c_.window_size;
    const float scale = float(1.0 / std::sqrt(double(hd)));
    // Window rows of earlier steps, dequantised once per session.
    std::vector<std::map<int64_t, std::vector<bf16_t>>> ring_rows(sessions_.size());
    for (size_t s = 0; s < sessions_.size(); ++s) {
      const SessionCache* sc = sessions_[s];
      const int64_t start = sc->next_pos;  // positions >= start come from this step
      for (int64_t q = std::max<int64_t>(0, start - W); q < start; ++q) {
        const uint8_t* b = sc->rings[size_t(l)].find(q);
        if (!b) continue;
        std::vector<bf16_t> v(static_cast<size_t>(hd));
        fp8_dequant_row(b, b + hd, hd, v.data());
        ring_rows[s][q] = std::move(v);
      }
    }
    // Compressed rows of the KV source, dequantised on demand per session.
    std::vector<std::vector<bf16_t>> comp_rows(sessions_.size());
    if (r.ratio > 0) {
      for (size_t s = 0; s < sessions_.size(); ++s) {
        const CompressedCache& cc = sessions_[s]->comp[size_t(r.kv_layer)];
        comp_rows[s].resize(size_t(cc.n_entries() * hd));
        for (int64_t j = 0; j < cc.n_entries(); ++j) {
          const uint8_t* b = cc.kv.data() + j * cc.kv_bytes;
          fp4_e4m3_dequant_row(b, b + hd / 2, hd, &comp_rows[s][size_t(j * hd)]);
        }
      }
    }
    const std::vector<std::vector<int32_t>>* sel = r.ratio > 0 ? &selections_.at(r.index_layer) : nullptr;
    if (probe_) attn_margin_ = sel ? sel_margin_.at(r.index_layer) : std::vector<float>(size_t(T_), INFINITY);
    for_rows([&](int64_t t) {
      const Row& row = step_.rows[size_t(t)];
      const int s = row.session;
      const int64_t p = row.pos, start = sessions_[size_t(s)]->next_pos, t0 = first_row_[size_t(s)];
      auto window_key = [&](int64_t q) -> const bf16_t* {
        if (q >= start) return &kv_[size_t((t0 + (q - start)) * hd)];
        auto it = ring_rows[size_t(s)].find(q);
        FB_CHECK(it != ring_rows[size_t(s)].end()) << "window row " << q << " missing at layer " << l;
        return it->second.data();
      };
      std::vector<const bf16_t*> keys;
      int64_t lo = std::max<int64_t>(0, p - W + 1);
      // Bounded replay: a decoder layer's window holds no key below the replay start (§8.4).
      if (row.kind == RowKind::kPrefill && l >= c_.decoder_start && c_.decoder_start >= 0) lo = std::max(lo, row.replay_start);
      if (row.kind == RowKind::kPrefill) {
        const int64_t width = std::min<int64_t>(row.prefill_end, W);
        for (int64_t q = lo; q <= p; ++q) keys.push_back(window_key(q));
        while (int64_t(keys.size()) < width) keys.push_back(nullptr);
      } else {
        for (int64_t i = 0; i < W - 1 - p; ++i) keys.push_back(nullptr);
        for (int64_t q = lo; q <= p; ++q) keys.push_back(window_key(q));
      }
      if (sel)
        for (int32_t id : (*sel)[size_t(t)]) keys.push_back(id < 0 ? nullptr : &comp_rows[size_t(s)][size_t(id) * size_t(hd)]);
      sparse_attention(&q_[size_t(t * c_.q_dim())], c_.n_heads, int(hd), keys, f32p(w.attn_sink), scale, &o_[size_t(t * c_.q_dim())]);
    });
  }

  void end_layer(int l) {
    // Ring writes after every row of the step attended (a chunk's rows must not overwrite
    // slots its earlier rows still read).
    const int64_t rb = c_.head_dim + c_.head_dim / 32;
    for (int64_t t : rows_) {
      SessionCache* s = sessions_[size_t(step_.rows[size_t(t)].session)];
      Ring& ring = s->rings[size_t(l)];
      const int64_t p = pos_[size_t(t)];
      std::copy(&kv_codes_[size_t(t * rb)], &kv_codes_[size_t(t * rb)] + rb, ring.slot(p));
      ring.pos[size_t(p % ring.slots)] = p;
    }
    if (taps_ && taps_->enabled) {
      if (taps_->after_block.size() < size_t(c_.n_layers)) taps_->after_block.resize(size_t(c_.n_layers));
      taps_->after_block[size_t(l)] = X_;
    }
    record(L(l, "x_out"), X_);
  }

  void head() {
    for (int64_t t = 0; t < T_; ++t)
      if (step_.rows[size_t(t)].want_logits) out_.logit_rows.push_back(int(t));
    out_.logits.resize(out_.logit_rows.size() * size_t(c_.vocab_size));
    for (size_t i = 0; i < out_.logit_rows.size(); ++i) {
      head_row(out_.logit_rows[i], m_.w_.norm, &out_.logits[i * size_t(c_.vocab_size)], nullptr);
      out_.argmax.push_back(model::logits_argmax(&out_.logits[i * size_t(c_.vocab_size)], c_.vocab_size));
    }
    if (!step_.logits_to_host) out_.logits.clear();  // as the CUDA executor (the caller reads argmax)
    for (size_t s = 0; s < sessions_.size(); ++s) {
      int64_t n = 0;
      for (const Row& r : step_.rows) n += r.session == int(s);
      sessions_[s]->next_pos += n;
    }
  }

 private:
  const model::Step& step_;
  const std::vector<SessionCache*>& sessions_;
  Taps* taps_;
  model::StepOutput out_;
  std::vector<int64_t> first_row_;
  std::vector<int64_t> staying_;  // rows that go on past the decoder's first layer (leave_begin)
  std::vector<int64_t> hashes_;  // [rows, tables, orders * heads]
  std::vector<int> engram_layers_;  // in layer order
  model::EngramRows* engram_count_ = nullptr;
  std::map<int, std::vector<std::vector<int32_t>>> selections_;  // per index layer, per row
  std::vector<std::vector<uint8_t>> pools_;                       // candidate mask per row
  // Probe only (layer gate): selection margins per index layer and row, of the newest pool.
  std::map<int, std::vector<float>> sel_margin_;
  std::vector<float> pool_margin_;
  // The executor's Engram staging (start_engram_staging) reads hashes_: the last member, so its
  // worker is done before the ids go away, also when the step fails half way.
  model::EngramStaging::Guard engram_guard_{m_.engram_staging_};
};

// ---------------------------------------------------------------------------------------------

Result<std::vector<uint16_t>> CpuModel::encode_image(const std::vector<uint16_t>& patches, int nvh, int nvw, std::vector<uint16_t>* vit) {
  if (!cfg_.has_vision()) return FB_ERROR(kUnsupported) << "the checkpoint has no vision tower";
  const int64_t P = 3LL * cfg_.vision.patch_size * cfg_.vision.patch_size;
  if (nvh <= 0 || nvw <= 0 || int64_t(patches.size()) != int64_t(nvh) * nvw * P)
    return FB_ERROR(kInvalidArgument) << "encode_image: " << patches.size() << " patch values for a " << nvh << "x" << nvw << " grid of " << P;
  const vision::VisionTower tower(cfg_, w_.vision);
  std::vector<uint16_t> f = tower.vit(patches, nvh, nvw);
  std::vector<uint16_t> aligned = tower.align(f, nvh, nvw);
  if (vit) *vit = std::move(f);
  return aligned;
}

Result<std::vector<uint16_t>> CpuModel::image_span_markers() const {
  if (!cfg_.has_vision()) return FB_ERROR(kUnsupported) << "the checkpoint has no vision tower";
  return vision::span_markers(w_.vision, cfg_.dim);
}

Result<model::StepOutput> CpuModel::forward(const model::Step& step, const std::vector<model::SessionState*>& sessions, Taps* taps) {
  std::vector<SessionCache*> s;
  for (auto* p : sessions) s.push_back(static_cast<SessionCache*>(p));
  return forward_cpu(step, s, taps, &op_times_, &engram_rows_);
}

model::ExecutorStats CpuModel::stats() const {
  model::ExecutorStats st;
  st.has_expert_traffic = experts_ && experts_->traffic(&st.experts);
  st.has_op_times = true;
  st.ops = op_times_;
  st.has_engram = !engram_.empty();
  st.engram = engram_rows_;
  model::MemoryByTier& m = st.memory;
  m.has_host = true;
  m.host.weights = experts_tiered_ ? weight_bytes_no_experts_ : weight_bytes_all_;
  if (engram_source_) {  // the tables stay on the drives; the row cache holds what steps read
    for (const model::LayerWeights& lw : w_.layers)
      if (lw.engram_table.valid()) m.host.weights -= uint64_t(lw.engram_table.nbytes() + lw.engram_table_scale.nbytes());
    m.host.weights += engram_source_->host_bytes();
  }
  for (const auto& w : wo_a_bf16_) m.host.weight_copies += uint64_t(w.size()) * sizeof(bf16_t);
  const SessionRegistry::Totals live = sessions_->totals();
  m.host.sessions = live.bytes;
  m.host.n_sessions = live.sessions;
  for (const model::RopeTable* r : {&rope_plain_, &rope_yarn_}) m.host.scratch += uint64_t(r->freqs.size()) * sizeof(float);
  for (const model::EngramTableConstants& e : engram_)
    m.host.scratch += uint64_t(e.primes.size() + e.offsets.size() + e.multipliers.size()) * sizeof(int64_t);
  m.host.experts = experts_ ? experts_->host_bytes() : 0;
  // Drives: what the tiers read for the routed experts, and the Engram rows the row cache read
  // (without it the tables stay in the mapping).
  m.has_drive = st.has_expert_traffic || engram_source_;
  m.drive.expert_bytes_read = st.experts.drive.bytes;
  m.drive.has_engram = engram_source_ != nullptr;
  if (engram_source_) m.drive.engram_bytes_read = engram_source_->drive_bytes_read();
  return st;
}

Result<model::StepOutput> CpuModel::forward_cpu(const model::Step& step, const std::vector<SessionCache*>& sessions, Taps* taps,
                                                model::OpTimes* op_times, model::EngramRows* engram_rows) const {
  // Rows of each session: contiguous positions starting at the session's next position.
  std::vector<int64_t> next(sessions.size());
  for (size_t s = 0; s < sessions.size(); ++s) next[s] = sessions[s]->next_pos;
  for (const Row& r : step.rows) {
    FB_RETURN_IF_ERROR(model::check_row(cfg_, step, r, next));
    if (r.replay_start != 0) FB_RETURN_IF_ERROR(model::check_replay_row(cfg_, r));
    ++next[size_t(r.session)];
  }
  const std::lock_guard<std::mutex> staging_lock(staging_mu_);  // one step at a time on the Engram staging
  CpuStep ex(*this, step, sessions, taps);
  ex.count_engram(engram_rows);
  if (op_times)
    model::run_backbone_timed(ex, cfg_, *op_times);
  else
    model::run_backbone(ex, cfg_);
  return ex.take_output();
}

}  // namespace fb::cpu
