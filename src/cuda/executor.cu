// CudaExecutor: the backbone step object (CudaStep) that runs model/forward.h on the GPU, and
// forward(); the sublayer ops it shares with the draft are in layer_ops.h, the draft in draft.cu,
// loading and sessions in weights.cu / session.cu. Class for class the mirror of cpu/executor.cpp.
#include "cuda/layer_ops.h"
#include "cuda/rs_gemv.h"
#include "model/engram_staging.h"
#include "model/step_parts.h"

#include <cstdio>

namespace fb::cuda {

// ---------------------------------------------------------------------------------------------
// Backbone step over rows of one or more sessions (cpu::CpuStep).
class CudaStep : public CudaLayerOps {
 public:
  CudaStep(const CudaExecutor& m, const model::Step& step, const std::vector<CudaSession*>& sessions, model::Taps* taps)
      : CudaLayerOps(m, int64_t(step.rows.size())), step_(step), sessions_(sessions), taps_(taps) {
    std::vector<int64_t> pos(static_cast<size_t>(T_));
    std::vector<uint8_t> image(static_cast<size_t>(T_));
    for (int64_t t = 0; t < T_; ++t) {
      pos[size_t(t)] = step.rows[size_t(t)].pos;
      image[size_t(t)] = step.rows[size_t(t)].image;
    }
    set_rows(pos, image);
    tc_ = m.tc_for(step);
    prefetch_ = m.prefetch_step(step);
    first_row_.assign(sessions.size(), -1);
    start_.assign(sessions.size(), 0);
    for (size_t s = 0; s < sessions.size(); ++s) start_[s] = sessions[s]->next_pos;
    for (int64_t t = 0; t < T_; ++t) {
      const int s = step.rows[size_t(t)].session;
      if (first_row_[size_t(s)] < 0) first_row_[size_t(s)] = t;
    }
    if (taps && taps->probe) probe_ = taps;
    n_taps_ = int(c_.dspark_target_layer_ids.size());
    taps_dev_ = taps_first_ = alloc<uint16_t>(T_ * n_taps_ * c_.dim);
    X_first_ = X_;
    if (taps_dev_ && n_taps_ > 0) step_status(cudaMemsetAsync(taps_dev_, 0, size_t(T_ * n_taps_ * c_.dim) * 2, st_));
    for (int64_t t = 0; t < T_; ++t) {
      CudaSession* s = sessions_[size_t(step.rows[size_t(t)].session)];
      s->tokens.push_back(step.rows[size_t(t)].token);
      s->image.push_back(step.rows[size_t(t)].image ? 1 : 0);
    }
    early_tables();
  }

  model::StepOutput take_output() {
    // Host time to enqueue the whole step (vs the GPU time: is the GPU starved?): up to the output
    // copies, which wait for the GPU (issue_ms_), else up to here.
    const double enqueue_ms =
        issue_ms_ >= 0 ? issue_ms_ : std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_begin_).count();
    m_.last_enqueue_ms_ = enqueue_ms;
    if (m_.profile_) {
      OpProfile& p = m_.prof_["step.enqueue"];
      p.ms += enqueue_ms;
      ++p.calls;
    }
    sync();
    flush_profile(true);
    return std::move(out_);
  }

  void embed() {
    ProfScope prof_scope_(this, "embed");
    if (!ok()) return;
    const uint16_t* given = step_.embeddings.empty() ? nullptr : upload(step_.embeddings);
    std::vector<uint64_t> src;
    for (const Row& r : step_.rows)
      src.push_back(r.embed_row >= 0 ? addr(given + int64_t(r.embed_row) * c_.dim) : addr(m_.embed_ + int64_t(r.token) * c_.dim));
    embed_tokens(src);
  }

  // Bounded replay (spec/11 §8.4, cpu::CpuStep::leave_begin): at Config::decoder_start the rows
  // below their replay_start (the step's first rows: forward() checks it) become the only rows for
  // their collapse and compressor, then leave: every row buffer of the step is advanced past
  // them, so the decoder runs on the rest with the same kernels.
  bool leave_begin(int) {
    int64_t n = 0;
    while (n < T_ && row(n).kind == RowKind::kPrefill && row(n).pos < row(n).replay_start) ++n;
    if (n == 0) return false;
    T_all_ = T_;
    T_ = n;
    return true;
  }
  void leave_end(int l) {
    const int64_t n = T_, D = c_.dim, hc = c_.hc_mult;
    // Their slots in the decoder rings are marked empty (those rings hold replayed rows only).
    for (int64_t t = 0; t < n; ++t) {
      CudaSession* s = sessions_[size_t(row(t).session)];
      for (int d = l; d < c_.n_layers; ++d) {
        DevRing& ring = s->rings[size_t(d)];
        ring.pos[size_t(row(t).pos % ring.slots)] = -1;
      }
    }
    X_ += n * hc * D;
    residual_ += n * hc * D;
    pre_ += n * hc;
    mix_a_ += n;
    mix_f_ += n;
    u_ += n * D;
    y_ += n * D;
    h_ += n * D;
    qr_ += n * c_.q_lora_rank;
    q_ += n * c_.q_dim();
    o_ += n * c_.q_dim();
    kv_ += n * c_.head_dim;
    kv_raw_ += n * c_.head_dim;
    kv_codes_ += n * row_bytes();
    auto advance = [n](QuantBuf& b, int64_t per_row) {
      b.codes += n * per_row;
      b.scales += n * per_row / 32;
      b.capacity -= n * per_row;
    };
    advance(uq_, D);
    advance(qrq_, c_.q_lora_rank);
    pos_ += n;
    image_ += n;
    taps_dev_ += n * n_taps_ * D;
    const int64_t hash_row = int64_t(m_.engram_.size()) * (c_.engram_max_ngram - 1) * c_.engram_n_heads;
    if (hashes_) hashes_ += n * hash_row;
    for (auto& [layer, sel] : selections_) {
      sel.ids += n * sel.ld;
      sel.count += n;
    }
    if (pool_mask_) pool_mask_ += n * pool_ld_;
    if (pool_len_) pool_len_ += n;
    row0_ += n;
    T_ = T_all_ - n;
    // Window keys of the step's own rows come from kv_codes_ from the first remaining row on.
    for (size_t s = 0; s < sessions_.size(); ++s) {
      first_row_[s] = -1;
      for (int64_t t = 0; t < T_ && first_row_[s] < 0; ++t)
        if (row(t).session == int(s)) first_row_[s] = t;
      if (first_row_[s] >= 0) start_[s] = row(first_row_[s]).pos;
    }
  }

  // spec/11 §6.3 row ids of both tables (host integer math: model::engram_row_ids, as the CPU).
  void engram_hash() {
    ProfScope prof_scope_(this, "engram_hash");
    if (!ok() || m_.engram_.empty()) return;
    const int n_tab = int(m_.engram_.size()), n_ord = c_.engram_max_ngram - 1, H = c_.engram_n_heads;
    std::vector<int64_t> hashes(size_t(T_ * n_tab * n_ord * H), 0);
    for (int64_t t = 0; t < T_; ++t) {
      const Row& r = row(t);
      const CudaSession* s = sessions_[size_t(r.session)];
      auto cls = [&](int64_t p) -> int64_t {
        if (s->image[size_t(p)]) return -1;
        return m_.token_map_.at(size_t(s->tokens[size_t(p)]));
      };
      model::engram_row_ids(m_.engram_, c_.engram_max_ngram, H, m_.pad_class_, r.pos, cls, &hashes[size_t(t * n_tab * n_ord * H)]);
    }
    hashes_ = upload(hashes);
    if (m_.engram_host_) {
      engram_ids_ = std::move(hashes);  // every row's ids, kept whole for the staging's tasks
      std::vector<model::EngramStaging::Table> tabs;
      for (int l = 0; l < c_.n_layers; ++l) {
        const int tab = c_.roles[size_t(l)].engram_table;
        if (tab < 0) continue;
        const model::LayerWeights& hw = m_.w_.layers[size_t(l)];
        tabs.push_back({hw.engram_table.data, hw.engram_table_scale.data, hw.engram_table.dim(0), tab, m_.engram_source_.get(), l});
        engram_layers_.push_back(l);
      }
      step(m_.engram_staging_.start(std::move(tabs), engram_ids_.data(), T_, n_tab, n_ord * H, c_.engram_head_dim,
                                 m_.run_.engram_prefetch_tasks));
    }
  }

  // spec/11 §6.4: gather + FP8 projection + per-stream gate, before block l.
  void engram(int l) {
    OpScope op_scope_(this, "engram");
    flush_post();  // (never pending here: defer_ffn_post_ok)
    if (no_rows()) return;
    const DevLayer& w = m_.layers_[size_t(l)];
    const int tab = c_.roles[size_t(l)].engram_table, n_tab = int(m_.engram_.size());
    const int n_cols = (c_.engram_max_ngram - 1) * c_.engram_n_heads, hd = c_.engram_head_dim, hc = c_.hc_mult;
    const int64_t D = c_.dim;
    if (probe_ && probe_->inject_engram_in.count(l)) inject_rows(probe_->inject_engram_in.at(l), X_, T_ * hc * D);
    uint16_t* E = alloc<uint16_t>(T_ * n_cols * hd);
    uint16_t* kv = alloc<uint16_t>(T_ * (1 + hc) * D);
    if (!ok()) return;
    // Executor::stats: rows read. Tables on the host: this layer's rows as the staging copied them
    // out of the mapped snapshot (model::EngramStaging, started when the ids were hashed: hidden
    // when staged before this point of the step's issue path, else exposed with the host's wait;
    // whether the GPU idled meanwhile is not measured), uploaded with one copy, then the same
    // gather over identity ids. Tables in HBM: read in place.
    if (m_.engram_host_) {
      const size_t k = size_t(std::find(engram_layers_.begin(), engram_layers_.end(), l) - engram_layers_.begin());
      if (k >= engram_layers_.size()) {
        step(FB_ERROR(kInternal) << "layer " << l << " has no staged Engram rows");
        return;
      }
      const model::EngramStaging::Rows staged = m_.engram_staging_.rows(k, &m_.engram_rows_);
      if (Status st = m_.engram_staging_.status(); !st.ok()) {  // no replica could supply a row
        step(std::move(st));
        return;
      }
      const int64_t sb = hd / 32, n = T_ * n_cols, first = row0_ * n_cols;
      std::vector<int64_t> ident(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) ident[size_t(i)] = i;
      const uint8_t *d_codes = nullptr, *d_scales = nullptr;
      const int64_t* d_ident = nullptr;
      if (first == 0) {
        std::tie(d_codes, d_scales, d_ident) = upload_all(m_.engram_staging_.codes(k), m_.engram_staging_.scales(k), ident);
      } else {  // rows that left at a bounded replay's decoder start are the staging's first row0_ rows
        const std::vector<uint8_t> codes(staged.codes + first * hd, staged.codes + (first + n) * hd);
        const std::vector<uint8_t> scales(staged.scales + first * sb, staged.scales + (first + n) * sb);
        std::tie(d_codes, d_scales, d_ident) = upload_all(codes, scales, ident);
      }
      if (!ok()) return;
      step(engram_gather(d_codes, d_scales, d_ident, n_cols, T_, n_cols, hd, E, st_));
    } else {
      const uint64_t n_rows = uint64_t(T_) * uint64_t(n_cols);
      m_.engram_rows_.rows += n_rows;
      m_.engram_rows_.bytes += n_rows * uint64_t(hd + hd / 32);
      step(engram_gather(w.engram_table, w.engram_table_scale, hashes_ + int64_t(tab) * n_cols, int64_t(n_tab) * n_cols, T_, n_cols, hd, E,
                         st_));
    }
    gemm_x(E, T_, w.engram_wkv, kv);
    step(engram_gate(X_, kv, w.engram_q, w.engram_k, T_, hc, D, c_.norm_eps, float(1.0 / std::sqrt(double(D))), image_, st_));
  }

  void dspark_tap(int tap) {
    ProfScope prof_scope_(this, "dspark_tap");
    flush_post();  // (never pending here: defer_ffn_post_ok)
    if (no_rows()) return;
    step(stream_mean(X_, T_, c_.hc_mult, c_.dim, taps_dev_ + int64_t(tap) * c_.dim, int64_t(n_taps_) * c_.dim, st_));
  }

  // Compressor of a KV source (spec/11 §4.4-4.6, §4.9b): latents of completed groups, appended
  // compressed entries and index keys BEFORE any scoring of this step.
  void compress(int l) {
    ProfScope prof_scope_(this, "compress");
    if (no_rows()) return;
    const DevLayer& w = m_.layers_[size_t(l)];
    const int ratio = c_.roles[size_t(l)].ratio;
    const int64_t D = c_.dim, hd = c_.head_dim, ihd = c_.index_head_dim;
    const DevRope& rp = m_.rope_for(l);
    float* kg = nullptr;  // ratio 2: [T, k | g] f32
    uint16_t* lat1 = nullptr;
    if (ratio == 2) {
      kg = alloc<float>(T_ * 2 * hd);
      if (!ok()) return;
      gemm_bf(u_, T_, D, D, w.comp_wkv, hd, kg, 2 * hd, GemmOut::kF32);
      gemm_bf(u_, T_, D, D, w.comp_wgate, hd, kg + hd, 2 * hd, GemmOut::kF32);
    } else {
      lat1 = alloc<uint16_t>(T_ * hd);
      if (!ok()) return;
      gemm_bf(u_, T_, D, D, w.comp_wkv, hd, lat1, hd, GemmOut::kBf16);
    }
    // Host walk in row order (CpuStep::compress): which rows emit which entry, where sources and
    // destinations live.
    std::vector<uint64_t> even, odd, tail_src, tail_dst;
    std::vector<int64_t> gpos;
    std::vector<int32_t> emit_rows;
    std::vector<std::pair<int, int64_t>> dst;  // (session, entry)
    std::vector<int64_t> added(sessions_.size(), 0);
    std::map<std::pair<int, int64_t>, int64_t> tail_writer;  // (session, slot) -> newest row
    for (int64_t t = 0; t < T_; ++t) {
      const int s = row(t).session;
      const int64_t p = row(t).pos;
      DevCompressed& cc = sessions_[size_t(s)]->comp[size_t(l)];
      if (ratio == 2) {
        tail_writer[{s, p % model::kTailSlots}] = t;
        if (p % 2 == 0) continue;
        const bool prev_here = t > 0 && row(t - 1).session == s && row(t - 1).pos == p - 1;
        even.push_back(prev_here ? addr(kg + (t - 1) * 2 * hd) : addr(cc.tail.get<float>() + ((p - 1) % model::kTailSlots) * 2 * hd));
        odd.push_back(addr(kg + t * 2 * hd));
      }
      const int64_t j = p / ratio;
      if (cc.n_entries + added[size_t(s)] != j) {
        step(FB_ERROR(kInternal) << "compressed cache of layer " << l << " out of step: entry " << j << " after "
                                 << cc.n_entries + added[size_t(s)]);
        return;
      }
      ++added[size_t(s)];
      gpos.push_back(j * ratio);
      emit_rows.push_back(int32_t(t));
      dst.push_back({s, j});
    }
    const int64_t E = int64_t(gpos.size());
    for (size_t s = 0; s < sessions_.size(); ++s)
      if (added[s]) step(sessions_[s]->reserve_compressed(l, sessions_[s]->comp[size_t(l)].n_entries + added[s], st_));
    if (E > 0 && ok()) {
      uint16_t* latent = alloc<uint16_t>(E * hd);
      uint16_t* tmp = alloc<uint16_t>(E * ihd);
      uint16_t* key = alloc<uint16_t>(E * ihd);
      const int64_t kvb = hd / 2 + hd / 16, keyb = ihd / 2 + ihd / 32;
      uint8_t* kv_stage = alloc<uint8_t>(E * kvb);
      uint8_t* key_stage = alloc<uint8_t>(E * keyb);
      const int64_t* gpos_d = upload(gpos);
      if (!ok()) return;
      if (ratio == 2) {
        uint16_t* pooled = alloc<uint16_t>(E * hd);
        if (!ok()) return;
        const auto [even_d, odd_d] = upload_all(even, odd);
        if (!ok()) return;
        step(ratio2_pool(even_d, odd_d, E, hd, pooled, st_));
        step(rms_norm(pooled, E, hd, w.comp_norm, c_.norm_eps, latent, st_));
      } else {
        step(rms_norm(lat1, E, hd, w.comp_norm, c_.norm_eps, latent, st_));  // every row emits, in row order
      }
      // index key from the PRE-RoPE latent
      gemm_bf(latent, E, hd, hd, w.idx_wk, ihd, tmp, ihd, GemmOut::kBf16);
      step(rms_norm(tmp, E, ihd, w.idx_k_norm, c_.norm_eps, key, st_));
      step(rope(key, E, 1, ihd, c_.rope_head_dim, gpos_d, rp.cos.get<float>(), rp.sin.get<float>(), false, st_));
      step(fp4_e8m0_qdq(key, E, ihd, key_stage, keyb, nullptr, st_));
      step(rope(latent, E, 1, hd, c_.rope_head_dim, gpos_d, rp.cos.get<float>(), rp.sin.get<float>(), false, st_));
      step(fp4_e4m3_qdq(latent, E, hd, kv_stage, kvb, nullptr, st_));
      std::vector<uint64_t> s_kv, d_kv, s_key, d_key;
      for (int64_t i = 0; i < E; ++i) {
        DevCompressed& cc = sessions_[size_t(dst[size_t(i)].first)]->comp[size_t(l)];
        const int64_t j = dst[size_t(i)].second;
        s_kv.push_back(addr(kv_stage + i * kvb));
        d_kv.push_back(addr(cc.kv.get<uint8_t>() + j * cc.kv_bytes));
        s_key.push_back(addr(key_stage + i * keyb));
        d_key.push_back(addr(cc.keys.get<uint8_t>() + j * cc.key_bytes));
      }
      const auto [s_kv_d, d_kv_d, s_key_d, d_key_d] = upload_all(s_kv, d_kv, s_key, d_key);
      if (!ok()) return;
      step(copy_rows(s_kv_d, d_kv_d, E, kvb, st_));
      step(copy_rows(s_key_d, d_key_d, E, keyb, st_));
    }
    // Tails (ratio 2): every row's (k, g) into its position slot (newest row per slot), written
    // after the pooling read them (cpu::CpuStep::compress, model::kTailSlots).
    if (ratio == 2) {
      for (const auto& [key, t] : tail_writer) {
        DevCompressed& tcc = sessions_[size_t(key.first)]->comp[size_t(l)];
        tcc.tail_pos[size_t(key.second)] = row(t).pos;
        float* tail = tcc.tail.get<float>();
        tail_src.push_back(addr(kg + t * 2 * hd));
        tail_dst.push_back(addr(tail + key.second * 2 * hd));
      }
      const auto [tail_src_d, tail_dst_d] = upload_all(tail_src, tail_dst);
      if (ok()) step(copy_rows(tail_src_d, tail_dst_d, int64_t(tail_src.size()), 2 * hd * int64_t(sizeof(float)), st_));
    }
    for (size_t s = 0; s < sessions_.size(); ++s) sessions_[s]->comp[size_t(l)].n_entries += added[s];
  }

  // Indexer (spec/11 §4.7-4.9): bf16 score chain, candidate pool, top-k selection per row.
  void index_select(int l) {
    ProfScope prof_scope_(this, "index_select");
    if (no_rows()) return;
    const DevLayer& w = m_.layers_[size_t(l)];
    const LayerRole& r = c_.roles[size_t(l)];
    const int ratio = r.ratio, IH = c_.index_n_heads, ihd = c_.index_head_dim;
    const int64_t D = c_.dim;
    const DevRope& rp = m_.rope_for(l);
    const float wscale = float(1.0 / std::sqrt(double(ihd)) / std::sqrt(double(IH)));
    std::vector<int64_t> n_vis(static_cast<size_t>(T_)), n_scored(static_cast<size_t>(T_));
    std::vector<uint64_t> keys_base(static_cast<size_t>(T_));
    int64_t ld = 1;
    for (int64_t t = 0; t < T_; ++t) {
      const Row& row = this->row(t);
      n_vis[size_t(t)] = (row.pos + 1) / ratio;
      n_scored[size_t(t)] = row.kind == RowKind::kPrefill ? row.prefill_end / ratio : n_vis[size_t(t)];
      ld = std::max(ld, n_scored[size_t(t)]);
      const DevCompressed& cc = sessions_[size_t(row.session)]->comp[size_t(r.kv_layer)];
      if (cc.n_entries < n_vis[size_t(t)]) {
        step(FB_ERROR(kInternal) << "layer " << l << ": " << cc.n_entries << " index keys, row needs " << n_vis[size_t(t)]);
        return;
      }
      keys_base[size_t(t)] = addr(cc.keys.get());
    }
    // Outliving this op: the selection (later layers reuse it), the candidate pool and the
    // n_scored list it is read with. Then the op's temporaries in a frame.
    Selection& sel = selections_[l];
    sel.ld = c_.index_topk;
    sel.ids = alloc<int32_t>(T_ * sel.ld);
    sel.count = alloc<int32_t>(T_);
    const int64_t* ns = early_.empty() ? upload(n_scored) : early_[size_t(l)].n_scored;
    uint8_t* new_pool = r.candidate_source ? alloc<uint8_t>(T_ * ld) : nullptr;
    Frame frame_(this);
    uint16_t* iq = alloc<uint16_t>(T_ * IH * ihd);
    uint16_t* wts = alloc<uint16_t>(T_ * IH);
    float* I = alloc<float>(T_ * ld);
    const auto [nv, kb] = early_.empty() ? upload_all(n_vis, keys_base) : std::make_tuple(early_[size_t(l)].n_vis, early_[size_t(l)].keys_base);
    if (!ok()) return;
    gemm_q(qrq_, T_, w.idx_wq_b, iq);
    step(rope(iq, T_, IH, ihd, c_.rope_head_dim, pos_, rp.cos.get<float>(), rp.sin.get<float>(), false, st_));
    step(fp4_e8m0_qdq(iq, T_ * IH, ihd, nullptr, 0, iq, st_));
    gemm_bf(u_, T_, D, D, w.idx_weights_proj, IH, wts, IH, GemmOut::kBf16);
    step(scale_bf16(wts, T_ * IH, wscale, st_));
    // Rows restricted to an earlier layer's pool score only the pool's entries (the rest are
    // -inf either way); the candidate source itself scores everything.
    const uint8_t* pool = r.pool_restricted && !r.candidate_source && pool_mask_ ? pool_mask_ : nullptr;
    const int64_t kbytes = ihd / 2 + ihd / 32;  // an FP4 key row: codes, then e8m0 scales per 32
    if (tc_)  // prefill rows: the dots on tensor cores (tc_gemm.h), the head chain as the CPU
      step(tc_index_scores(*tc_, iq, wts, T_, IH, ihd, keys_base, n_vis, n_scored, kbytes, nv, ns, I, ld, st_, pool, pool_ld_, pool_len_));
    else if (m_.fast_index_ && fast_index_scores_ok(T_, IH, ihd, kbytes, keys_base))  // [fast] decode rows: the dots on tensor cores
      step(fast_index_scores(iq, wts, T_, IH, ihd, kb, kbytes, nv, ns, I, ld, st_, pool, pool_ld_, pool_len_));
    else
      step(index_scores(iq, wts, T_, IH, ihd, kb, kbytes, nv, ns, I, ld, st_, pool, pool_ld_, pool_len_));
    if (r.candidate_source) {
      pool_mask_ = new_pool;
      pool_ld_ = ld;
      pool_len_ = ns;
      if (!ok()) return;
      step(candidate_pool(I, T_, ld, ns, nv, c_.candidate_block_size, c_.candidate_topk_blocks, pool_mask_, st_));
    }
    const uint8_t* mask = r.pool_restricted ? pool_mask_ : nullptr;
    if (r.pool_restricted && !mask) {
      step(FB_ERROR(kInternal) << "layer " << l << " is pool-restricted but no candidate pool was published");
      return;
    }
    if (probe_) probe_index_margins(l, r, I, ld, n_vis, n_scored);
    step(topk_select(I, T_, ld, ns, nv, mask, pool_ld_, pool_len_, sel.ld, sel.ids, sel.count, st_));
  }

  // ---- layer gate (Taps::probe): injection, sublayer outputs and selection margins ----------
  // The backbone calls these wrappers (model::run_backbone is a template over CudaStep), which
  // add the probe's work around the shared ops; without a probe they only forward.
  void hc_mixes(int l, Site site) {
    if (probe_ && site == Site::kAttn && l < c_.n_layers && ok()) {
      const int64_t n = T_ * c_.hc_mult * c_.dim;
      if (c_.roles[size_t(l)].engram_table >= 0) probe_->blocks[l].engram_out = download_f32(X_, n);
      if (probe_->inject_x.count(l)) {
        inject_rows(probe_->inject_x.at(l), X_, n);
        const std::vector<float>& p = probe_->inject_pre.at(l);
        if (int64_t(p.size()) != T_ * c_.hc_mult) {
          step(FB_ERROR(kInvalidArgument) << "injected pre of layer " << l << " has " << p.size() << " values for " << T_ << " rows");
          return;
        }
        step(cuda_status(cudaMemcpyAsync(pre_, p.data(), p.size() * sizeof(float), cudaMemcpyHostToDevice, st_), "inject"));
        sync();
      }
    }
    CudaLayerOps::hc_mixes(l, site);
  }
  void attn_output(int l) {
    CudaLayerOps::attn_output(l);
    if (!probe_ || l >= c_.n_layers || !ok()) return;
    model::Taps::BlockProbe& b = probe_->blocks[l];
    b.attn_out = download_f32(y_, T_ * c_.dim);
    const LayerRole& r = c_.roles[size_t(l)];
    auto it = r.ratio > 0 ? sel_margin_.find(r.index_layer) : sel_margin_.end();
    b.attn_margin = it != sel_margin_.end() ? it->second : std::vector<float>(size_t(T_), INFINITY);
  }
  void moe(int l) {
    CudaLayerOps::moe(l);
    if (!probe_ || l >= c_.n_layers || !ok()) return;
    model::Taps::BlockProbe& b = probe_->blocks[l];
    b.ffn_out = download_f32(y_, T_ * c_.dim);
    // The router's biased scores of this call (route()'s scratch, kept by CudaLayerOps::moe).
    const int E = c_.roles[size_t(l)].n_experts, K = c_.roles[size_t(l)].n_active;
    std::vector<float> biased;
    download(biased, route_biased_, T_ * E);
    sync();
    if (!ok()) return;
    b.ffn_margin.assign(size_t(T_), INFINITY);
    for (int64_t t = 0; t < T_; ++t) {
      const float am = size_t(t) < b.attn_margin.size() ? b.attn_margin[size_t(t)] : INFINITY;
      b.ffn_margin[size_t(t)] = std::min(am, model::selection_margin(&biased[size_t(t * E)], E, K));
    }
  }

  // The window keys of layer l's attention for every row (decode rows: -1 padding at the front;
  // prefill rows: at the end up to prefill_end's width), the rows' offsets into them and each row's
  // compressed cache base. -1, or the position of a window row the ring lost.
  int64_t window_tables(int l, std::vector<uint64_t>& win, std::vector<int32_t>& off, std::vector<uint64_t>& comp_base) const {
    const LayerRole& r = c_.roles[size_t(l)];
    const int64_t W = c_.window_size;
    win.clear();
    off.assign(1, 0);
    comp_base.assign(static_cast<size_t>(T_), 0);
    for (int64_t t = 0; t < T_; ++t) {
      const Row& row = this->row(t);
      const int s = row.session;
      const int64_t p = row.pos, start = start_[size_t(s)], t0 = first_row_[size_t(s)];
      const DevRing& ring = sessions_[size_t(s)]->rings[size_t(l)];
      bool missing = false;
      auto window_key = [&](int64_t q) -> uint64_t {
        if (q >= start) return addr(kv_codes_ + (t0 + (q - start)) * row_bytes());
        const uint8_t* b = ring.find(q);
        if (!b) missing = true;
        return addr(b);
      };
      int64_t lo = std::max<int64_t>(0, p - W + 1);
      // Bounded replay: a decoder layer's window holds no key below the replay start (§8.4).
      if (row.kind == RowKind::kPrefill && c_.decoder_start >= 0 && l >= c_.decoder_start) lo = std::max(lo, row.replay_start);
      const size_t n0 = win.size();
      if (row.kind == RowKind::kPrefill) {
        const int64_t width = std::min<int64_t>(row.prefill_end, W);
        for (int64_t q = lo; q <= p; ++q) win.push_back(window_key(q));
        while (int64_t(win.size() - n0) < width) win.push_back(0);
      } else {
        for (int64_t i = 0; i < W - 1 - p; ++i) win.push_back(0);
        for (int64_t q = lo; q <= p; ++q) win.push_back(window_key(q));
      }
      if (missing) return p;
      off.push_back(int32_t(win.size()));
      if (r.ratio > 0) comp_base[size_t(t)] = addr(sessions_[size_t(s)]->comp[size_t(r.kv_layer)].kv.get());
    }
    return -1;
  }

  void attention(int l) {
    OpScope op_scope_(this, "attention");
    if (no_rows()) return;
    const DevLayer& w = m_.layers_[size_t(l)];
    const LayerRole& r = c_.roles[size_t(l)];
    const int64_t hd = c_.head_dim;
    const float scale = float(1.0 / std::sqrt(double(hd)));
    AttnKeys keys;
    uint64_t* comp_base_d = nullptr;
    int max_win = 0;
    if (!early_.empty()) {  // the step's tables, uploaded at its start (early_uploads)
      const EarlyTables& e = early_[size_t(l)];
      keys.win = e.win;
      keys.win_off = e.off;
      comp_base_d = e.comp_base;
      max_win = e.max_win;
    } else {
      std::vector<uint64_t> win, comp_base;
      std::vector<int32_t> off;
      if (const int64_t p = window_tables(l, win, off, comp_base); p >= 0) {
        step(FB_ERROR(kInternal) << "window row missing at layer " << l << " for position " << p);
        return;
      }
      std::tie(keys.win, keys.win_off, comp_base_d) = upload_all(win, off, comp_base);
      for (size_t t = 0; t + 1 < off.size(); ++t) max_win = std::max(max_win, off[t + 1] - off[t]);
    }
    if (r.ratio > 0) {
      auto it = selections_.find(r.index_layer);
      if (it == selections_.end()) {
        step(FB_ERROR(kInternal) << "layer " << l << " reads the selection of layer " << r.index_layer << ", which did not run");
        return;
      }
      keys.sel = it->second.ids;
      keys.sel_count = it->second.count;
      keys.sel_ld = it->second.ld;
      keys.comp_base = comp_base_d;
    }
    const int max_keys = max_win + (keys.sel ? int(keys.sel_ld) : 0);
    if (tc_) {  // prefill rows: dots and P.V sums on tensor cores (tc_gemm.h)
      keys.max_keys = max_keys;
      step(tc_sparse_attention(*tc_, q_, T_, c_.n_heads, int(hd), keys, w.attn_sink, scale, o_, st_));
      return;
    }
    attend(l, keys, max_keys, w.attn_sink, scale);
  }

  // CudaRunOptions::early_uploads: a step of decode / verify rows uploads every layer's window
  // tables and ring-write tables in one copy at its start instead of two copies per layer on the
  // main stream (each a stream operation that also ends the PDL overlap of the kernel after it).
  // They are what attention(l) and end_layer(l) would build: a layer's ring changes only in its
  // own end_layer, and the compressed caches get this step's capacity first, so their bases hold.
  // Also index_select's row tables (visible counts, key bases) of the indexer layers.
  struct EarlyTables {
    const uint64_t* win = nullptr;
    const int32_t* off = nullptr;
    uint64_t* comp_base = nullptr;
    const uint64_t *src = nullptr, *dst = nullptr;
    int64_t n_writes = 0;
    int max_win = 0;
    int64_t *n_scored = nullptr, *n_vis = nullptr;  // index_select's (indexer layers)
    uint64_t* keys_base = nullptr;
  };
  void early_tables() {
    if (!m_.early_uploads_ || T_ > kFastSmallMaxRows || !ok()) return;
    for (int64_t t = 0; t < T_; ++t)
      if (row(t).kind != RowKind::kDecode) return;
    std::vector<int64_t> rows_of(sessions_.size(), 0);
    for (int64_t t = 0; t < T_; ++t) ++rows_of[size_t(row(t).session)];
    for (size_t s = 0; s < sessions_.size(); ++s)  // a step adds at most one entry per row to each compressed cache
      for (size_t l = 0; l < sessions_[s]->comp.size() && rows_of[s]; ++l)
        if (sessions_[s]->comp[l].ratio) step(sessions_[s]->reserve_compressed(int(l), sessions_[s]->comp[l].n_entries + rows_of[s], st_));
    if (!ok()) return;
    std::vector<uint8_t> pack;
    auto put = [&](const auto& v) {
      const size_t at = (pack.size() + 15) / 16 * 16, bytes = v.size() * sizeof(v[0]);
      pack.resize(at + bytes);
      if (bytes) std::memcpy(pack.data() + at, v.data(), bytes);
      return at;
    };
    struct At {
      size_t win, off, comp_base, src, dst, n_vis = 0, keys_base = 0;
      int64_t n_writes;
      int max_win;
    };
    std::vector<At> at(size_t(c_.n_layers));
    std::vector<uint64_t> win, comp_base, src, dst;
    std::vector<int32_t> off;
    for (int l = 0; l < c_.n_layers; ++l) {
      if (window_tables(l, win, off, comp_base) >= 0) return;  // attention(l) builds them and reports it
      ring_tables(l, src, dst);
      At& a = at[size_t(l)];
      a.win = put(win), a.off = put(off), a.comp_base = put(comp_base), a.src = put(src), a.dst = put(dst);
      a.n_writes = int64_t(src.size());
      a.max_win = 0;
      for (size_t t = 0; t + 1 < off.size(); ++t) a.max_win = std::max(a.max_win, off[t + 1] - off[t]);
      const LayerRole& r = c_.roles[size_t(l)];
      if (r.index_source) {  // index_select's visible counts (decode rows score what they see) and key bases
        std::vector<int64_t> n_vis(static_cast<size_t>(T_));
        std::vector<uint64_t> keys_base(static_cast<size_t>(T_));
        for (int64_t t = 0; t < T_; ++t) {
          n_vis[size_t(t)] = (row(t).pos + 1) / r.ratio;
          keys_base[size_t(t)] = addr(sessions_[size_t(row(t).session)]->comp[size_t(r.kv_layer)].keys.get());
        }
        a.n_vis = put(n_vis), a.keys_base = put(keys_base);
      }
    }
    uint8_t* base = upload(pack);
    if (!base || !ok()) return;
    early_.resize(size_t(c_.n_layers));
    for (int l = 0; l < c_.n_layers; ++l) {
      const At& a = at[size_t(l)];
      EarlyTables& e = early_[size_t(l)];
      e.win = reinterpret_cast<const uint64_t*>(base + a.win);
      e.off = reinterpret_cast<const int32_t*>(base + a.off);
      e.comp_base = reinterpret_cast<uint64_t*>(base + a.comp_base);
      e.src = reinterpret_cast<const uint64_t*>(base + a.src);
      e.dst = reinterpret_cast<const uint64_t*>(base + a.dst);
      e.n_writes = a.n_writes;
      e.max_win = a.max_win;
      if (c_.roles[size_t(l)].index_source) {
        e.n_scored = e.n_vis = reinterpret_cast<int64_t*>(base + a.n_vis);
        e.keys_base = reinterpret_cast<uint64_t*>(base + a.keys_base);
      }
    }
  }

  bool defer_ffn_post_ok(int l) const override {
    if (l + 1 >= c_.n_layers || probe_ || (taps_ && taps_->enabled)) return false;
    const LayerRole& r = c_.roles[size_t(l + 1)];  // engram, the DSpark tap and a bounded-replay collapse read X
    return r.engram_table < 0 && r.dspark_tap < 0 && l + 1 != c_.decoder_start;
  }

  void end_layer(int l) {
    ProfScope prof_scope_(this, "end_layer");
    if (!ok()) return;
    // Ring writes after every row of the step attended; of rows sharing a slot the last wins.
    for (int64_t t = 0; t < T_; ++t) {
      DevRing& ring = sessions_[size_t(row(t).session)]->rings[size_t(l)];
      ring.pos[size_t(row(t).pos % ring.slots)] = row(t).pos;
    }
    if (!early_.empty()) {
      const EarlyTables& e = early_[size_t(l)];
      step(copy_rows(e.src, e.dst, e.n_writes, row_bytes(), st_));
    } else {
      std::vector<uint64_t> src, dst;
      ring_tables(l, src, dst);
      const auto [src_d, dst_d] = upload_all(src, dst);
      if (ok()) step(copy_rows(src_d, dst_d, int64_t(src.size()), row_bytes(), st_));
    }
    if (taps_ && taps_->enabled) {
      if (taps_->after_block.size() < size_t(c_.n_layers)) taps_->after_block.resize(size_t(c_.n_layers));
      // Every row of the step (rows that left keep the stream they left with, as on the CPU).
      download(taps_->after_block[size_t(l)], X_first_, int64_t(step_.rows.size()) * c_.hc_mult * c_.dim);
      sync();
    }
  }

  // The sources (the step's compact rows) and ring slots of layer l's ring writes; of rows sharing
  // a slot the last wins.
  void ring_tables(int l, std::vector<uint64_t>& src, std::vector<uint64_t>& dst) const {
    std::map<int64_t, std::pair<uint64_t, uint64_t>> writes;  // key: session * 2^40 + slot
    for (int64_t t = 0; t < T_; ++t) {
      const int s = row(t).session;
      const DevRing& ring = sessions_[size_t(s)]->rings[size_t(l)];
      const int64_t p = row(t).pos;
      writes[(int64_t(s) << 40) + p % ring.slots] = {addr(kv_codes_ + t * row_bytes()), addr(ring.slot(p))};
    }
    src.clear();
    dst.clear();
    for (auto& [k, v] : writes) {
      src.push_back(v.first);
      dst.push_back(v.second);
    }
  }

  void head() {
    ProfScope prof_scope_(this, "head");
    flush_post();  // (never pending here: defer_ffn_post_ok)
    if (!ok()) return;
    std::vector<int32_t> rows;
    for (int64_t t = 0; t < T_; ++t)
      if (row(t).want_logits) {
        out_.logit_rows.push_back(int(row0_ + t));  // index into the step's rows
        rows.push_back(int32_t(t));
      }
    float* logits = alloc<float>(int64_t(rows.size()) * c_.vocab_size);
    head_rows(rows, m_.norm_, logits, nullptr);
    // The copies to pageable vectors below wait for the GPU: the step's host issue time ends here.
    issue_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_begin_).count();
    if (!rows.empty()) {  // each row's greedy token; the rows themselves only when the caller reads them
      int32_t* best = alloc<int32_t>(int64_t(rows.size()));
      if (ok()) step(rows_argmax(logits, int64_t(rows.size()), c_.vocab_size, best, st_));
      download(out_.argmax, best, int64_t(rows.size()));
    }
    if (step_.logits_to_host) download(out_.logits, logits, int64_t(rows.size()) * c_.vocab_size);
    // Tap rows from step_.taps_from_row on (the caller reads no earlier row).
    const int64_t n_rows = int64_t(step_.rows.size());
    const int64_t tw = n_taps_ * c_.dim, from = std::clamp<int64_t>(step_.taps_from_row, 0, n_rows);
    out_.taps_first_row = from;
    download(out_.taps, taps_first_ + from * tw, (n_rows - from) * tw);
    sync();
    if (!ok()) return;
    for (size_t s = 0; s < sessions_.size(); ++s) {
      int64_t n = 0;
      for (const Row& r : step_.rows) n += r.session == int(s);
      sessions_[s]->next_pos += n;
    }
  }

 private:
  struct Selection {
    int32_t* ids = nullptr;    // [T, ld] ascending, -1 = empty
    int32_t* count = nullptr;  // [T]
    int64_t ld = 0;
  };
  void step_status(cudaError_t e) { step(cuda_status(e, "step")); }
  // Probe helpers (layer gate): host f32 rows -> bf16 device rows, device bf16 -> host f32.
  void inject_rows(const std::vector<float>& x, uint16_t* dst, int64_t n) {
    if (!ok()) return;
    if (int64_t(x.size()) != n || row0_ != 0) {
      step(FB_ERROR(kInvalidArgument) << "injected rows hold " << x.size() << " values, the step needs " << n);
      return;
    }
    std::vector<uint16_t> b(x.size());
    for (size_t i = 0; i < x.size(); ++i) b[i] = bf16_bits_from_f32(x[i]);
    step(cuda_status(cudaMemcpyAsync(dst, b.data(), b.size() * 2, cudaMemcpyHostToDevice, st_), "inject"));
    sync();  // b goes out of scope
  }
  std::vector<float> download_f32(const uint16_t* src, int64_t n) {
    std::vector<uint16_t> b;
    download(b, src, n);
    sync();
    std::vector<float> out(b.size());
    for (size_t i = 0; i < b.size(); ++i) out[i] = bf16_to_f32(b[i]);
    return out;
  }
  // Margins of index layer l's selection by the scores this executor computed (I before the top-k
  // masks it): its own top-k over the scored slice (pool-restricted rows: only the pool's
  // entries compete) and the candidate pool it is restricted to.
  void probe_index_margins(int l, const LayerRole& r, const float* I_dev, int64_t ld, const std::vector<int64_t>& n_vis,
                           const std::vector<int64_t>& n_scored) {
    std::vector<float> I;
    download(I, I_dev, T_ * ld);
    sync();
    if (!ok()) return;
    if (r.candidate_source) {
      pool_margin_.assign(size_t(T_), INFINITY);
      pool_host_.assign(size_t(T_ * ld), 0);
      pool_host_ld_ = ld;
      pool_host_len_ = n_scored;
      download(pool_host_, pool_mask_, T_ * ld);
      sync();
      for (int64_t t = 0; t < T_; ++t)
        pool_margin_[size_t(t)] = model::pool_margin(&I[size_t(t * ld)], n_scored[size_t(t)], n_vis[size_t(t)], c_.candidate_block_size,
                                                     c_.candidate_topk_blocks);
    }
    std::vector<float>& m = sel_margin_[l];
    m.assign(size_t(T_), INFINITY);
    for (int64_t t = 0; t < T_; ++t) {
      float* row = &I[size_t(t * ld)];
      const int64_t ns = n_scored[size_t(t)];
      if (r.pool_restricted && !pool_host_.empty())
        for (int64_t j = 0; j < ns; ++j)
          if (j >= pool_host_len_[size_t(t)] || !pool_host_[size_t(t * pool_host_ld_ + j)]) row[j] = -INFINITY;
      m[size_t(t)] = model::selection_margin(row, ns, std::min<int64_t>(c_.index_topk, ns));
      if (r.pool_restricted && !pool_margin_.empty()) m[size_t(t)] = std::min(m[size_t(t)], pool_margin_[size_t(t)]);
    }
  }
  // Row t of the rows still running (after bounded-replay rows left: step_.rows[row0_ + t]).
  const Row& row(int64_t t) const { return step_.rows[size_t(row0_ + t)]; }

  const model::Step& step_;
  int64_t row0_ = 0;   // rows that left at the decoder (bounded replay)
  int64_t T_all_ = 0;  // the step's rows while some are about to leave
  uint16_t* X_first_ = nullptr;     // X_ of row 0 (detailed taps cover every row of the step)
  uint16_t* taps_first_ = nullptr;  // taps_dev_ of row 0
  const std::vector<CudaSession*>& sessions_;
  model::Taps* taps_;
  model::Taps* probe_ = nullptr;  // layer gate (Taps::probe)
  std::map<int, std::vector<float>> sel_margin_;  // probe: per index layer, per row
  std::vector<float> pool_margin_;                // probe: the newest candidate pool's margins
  std::vector<uint8_t> pool_host_;                // probe: that pool's mask [T, ld] on the host
  int64_t pool_host_ld_ = 0;
  std::vector<int64_t> pool_host_len_;
  model::StepOutput out_;
  std::vector<int64_t> first_row_, start_;
  int n_taps_ = 0;
  std::vector<EarlyTables> early_;  // early_uploads: every layer's tables (empty: built per layer)
  double issue_ms_ = -1;  // host ms from the step's start to its first output copy (take_output)
  uint16_t* taps_dev_ = nullptr;  // [T, n_taps, D]
  int64_t* hashes_ = nullptr;     // [T, tables, orders * heads]
  // Tables on the host: the step's Engram layers in order and the ids of every row of the step
  // (read by the executor's staging, joined by engram_guard_ below).
  std::vector<int> engram_layers_;
  std::vector<int64_t> engram_ids_;
  std::map<int, Selection> selections_;
  uint8_t* pool_mask_ = nullptr;
  int64_t pool_ld_ = 0;
  const int64_t* pool_len_ = nullptr;
  // The executor's Engram staging reads engram_ids_: the last member, so its workers are done
  // before the ids go away, also when the step fails half way.
  model::EngramStaging::Guard engram_guard_{m_.engram_staging_};
};

Result<model::StepOutput> CudaExecutor::forward(const model::Step& step, const std::vector<model::SessionState*>& sessions, model::Taps* taps) {
  std::vector<CudaSession*> ss;
  for (auto* p : sessions) {
    auto* s = dynamic_cast<CudaSession*>(p);
    if (!s) return FB_ERROR(kInvalidArgument) << "session was not made by the CUDA executor";
    FB_RETURN_IF_ERROR(s->ensure_allocated(stream_));
    ss.push_back(s);
  }
  std::vector<int64_t> next(ss.size());
  for (size_t s = 0; s < ss.size(); ++s) next[s] = ss[s]->next_pos;
  int64_t max_pos = 0;
  bool staying_seen = false;
  for (const Row& r : step.rows) {
    FB_RETURN_IF_ERROR(model::check_row(cfg_, step, r, next));
    if (r.replay_start != 0) {
      if (!bounded_replay_enabled())
        return FB_ERROR(kUnsupported) << "bounded replay is turned off for this CUDA executor (run option bounded_replay=0)";
      FB_RETURN_IF_ERROR(model::check_replay_row(cfg_, r));
    }
    // Rows that leave at the decoder (CudaStep::leave_begin) are the step's first rows: the
    // decoder then runs on the rest of every row buffer.
    const bool leaves = r.kind == RowKind::kPrefill && r.pos < r.replay_start;
    if (leaves && staying_seen)
      return FB_ERROR(kUnsupported) << "bounded replay on CUDA: rows below replay_start must come before every other row of the step";
    staying_seen = staying_seen || !leaves;
    ++next[size_t(r.session)];
    max_pos = std::max(max_pos, r.pos);
  }
  if (step.rows.empty()) return model::StepOutput{};
  // [fast] Row invariance of shared steps (issue 20, docs/numerics.md): the fast class's decode
  // kernels (GEMVs, fused small ops, attention) take steps of at most 64 rows and a larger step
  // that is not a tensor-core prefill step takes the exact ones, so a decode row beside enough
  // other rows (several sessions' verify blocks, a prompt chunk) would change bits. Such a step
  // runs as parts of its own (model::split_step): its prompt chunk alone (the kernels that chunk
  // takes alone), then whole sessions' rows in parts of at most 64. A decode row then always runs
  // in a step of <= 64 rows that is not a tensor-core step: its kernels depend on its own kind
  // only. Each part reads the weights again; in the exact class every kernel is row-invariant
  // (the CPU's bits) and steps stay whole. Layer-gate taps are per step: such steps stay whole.
  constexpr int64_t kRowInvariantMaxRows = 64;  // layer_ops.h kFastGemvMaxRows
  static_assert(kRowInvariantMaxRows <= kFastAttnMaxRows && kRowInvariantMaxRows <= kFastSmallMaxRows);
  if ((fast_gemv_ || fast_small_ || fast_attn_) && !taps && int64_t(step.rows.size()) > kRowInvariantMaxRows) {
    const std::vector<model::StepPart> parts = model::split_step(step, kRowInvariantMaxRows);
    if (parts.size() > 1) {
      model::StepOutput all;
      for (const model::StepPart& p : parts) {
        auto o = forward(model::part_step(step, p), sessions, nullptr);
        if (!o.ok()) return o.status();  // earlier parts stay in their sessions: as a failed step
        model::append_part_output(&all, std::move(o).value(), p, int64_t(step.rows.size()), step.taps_from_row);
      }
      return all;
    }
  }
  set_fp8_gemv_fma(run_.fp8_fma);  // process-wide switches: this executor's choice for its steps
  set_fast_gemv_occupancy(run_.fast_occupancy);
  set_fast_gemv_tc(run_.tc_gemv);
  set_fast_gemv_rs(run_.numerics == Numerics::kFast ? run_.rs_gemv : 0);
  rs_set_group_rows(run_.rs_group_rows);
  rs_set_group_ctas(run_.rs_group_ctas);
  set_tc_dequant_x32(run_.dequant_x32);
  ws_.sm_uploads = run_.sm_uploads && prefetch_step(step);  // only beside a layer-ahead expert stream (the copy engines' queue)
  ws_.reuse_staging = run_.reuse_staging;
  ws_.pinned_ids = run_.pinned_ids;
  fast_attention_set_heads_per_cta(run_.attn_heads_per_cta);
  FB_RETURN_IF_ERROR(rope_plain_.ensure(max_pos + 1, stream_));
  FB_RETURN_IF_ERROR(rope_yarn_.ensure(max_pos + 1, stream_));
  model::StepOutput out;
  const auto wall0 = std::chrono::steady_clock::now();
  if (prefetch_step(step)) {
    // The first tiered layer's experts start crossing now, beside the embedding and the layers
    // before it; each tiered moe() issues the next one (CudaLayerOps::moe).
    slots_->drop_staged();
    for (int l = 0; l < cfg_.n_layers; ++l)
      if (tiered(l)) {
        FB_RETURN_IF_ERROR(slots_->prefetch(l));
        break;
      }
  }
  {
    CudaStep ex(*this, step, ss, taps);
    FB_RETURN_IF_ERROR(ex.status());
    model::run_backbone(ex, cfg_);
    FB_RETURN_IF_ERROR(ex.status());
    out = ex.take_output();
    FB_RETURN_IF_ERROR(ex.status());
  }
  if (slots_) slots_->settle();
  if (profile_) {
    OpProfile& p = prof_["step.wall"];
    p.ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0).count();
    ++p.calls;
  }
  return out;
}

// Batched over the n positions (rows are independent); ring slots shared by several positions
// keep the last, as the CPU's sequential loop does.
}  // namespace fb::cuda
