// The DSpark draft block on the CPU (CpuDraftStep) and the model's draft entry points.
#include "cpu/layer_ops.h"

namespace fb::cpu {

// ---------------------------------------------------------------------------------------------
// DSpark draft block (spec/13 §4): B rows at positions p+1..p+B, bidirectional inside the block,
// keys = the stage's ring in SLOT order, then the block rows.
class CpuDraftStep : public CpuLayerOps {
 public:
  CpuDraftStep(const CpuModel& m, SessionCache& s, int32_t anchor, int64_t p, const model::DraftPicker* pick)
      : CpuLayerOps(m, m.cfg_.dspark_block_size), s_(s), anchor_(anchor), p_(p), pick_(pick) {
    for (int64_t k = 0; k < T_; ++k) pos_[size_t(k)] = p + 1 + k;
  }

  void embed() {
    std::vector<int32_t> tokens(size_t(T_), c_.dspark_noise_token_id);
    tokens[0] = anchor_;
    embed_rows(tokens, std::vector<const bf16_t*>(size_t(T_), nullptr));
  }

  void attention(int l) {
    const auto& w = m_.w_.layers[size_t(l)];
    const int64_t hd = c_.head_dim;
    const Ring& ring = s_.draft_rings[size_t(l - c_.n_layers)];
    const int64_t n = std::min<int64_t>(c_.window_size, p_ + 1);
    std::vector<bf16_t> ring_rows(static_cast<size_t>(n * hd));
    std::vector<const bf16_t*> keys;
    for (int64_t slot = 0; slot < n; ++slot) {
      const uint8_t* b = ring.data.data() + slot * ring.row_bytes;
      fp8_dequant_row(b, b + hd, hd, &ring_rows[size_t(slot * hd)]);
      keys.push_back(&ring_rows[size_t(slot * hd)]);
    }
    for (int64_t k = 0; k < T_; ++k) keys.push_back(&kv_[size_t(k * hd)]);
    const float scale = float(1.0 / std::sqrt(double(hd)));
    parallel_for(0, T_, [&](int64_t t) {
      sparse_attention(&q_[size_t(t * c_.q_dim())], c_.n_heads, int(hd), keys, f32p(w.attn_sink), scale, &o_[size_t(t * c_.q_dim())]);
    });
  }

  void head() {
    hH_.assign(size_t(T_ * c_.dim), 0);
    U_.assign(size_t(T_ * c_.vocab_size), 0.0f);
    for (int64_t k = 0; k < T_; ++k) head_row(k, m_.w_.draft.norm, &U_[size_t(k * c_.vocab_size)], &hH_[size_t(k * c_.dim)]);
  }

  // spec/13 §4.6-4.7: sequential Markov bias over the full vocabulary, draws (argmax, first
  // index on ties, unless a picker draws), raw confidence logits.
  void markov_chain() {
    const int64_t V = c_.vocab_size, r = c_.dspark_markov_rank, D = c_.dim;
    const bf16_t* EM = bfp(m_.w_.draft.markov_embed);
    const bf16_t* HM = bfp(m_.w_.draft.markov_head);
    const bf16_t* WC = bfp(m_.w_.draft.confidence);
    out_.ids.push_back(anchor_);
    int32_t prev = anchor_;
    for (int64_t k = 1; k <= T_; ++k) {
      const bf16_t* e = EM + int64_t(prev) * r;
      float* lk = &U_[size_t((k - 1) * V)];
      parallel_for(0, (V + 4095) / 4096, [&](int64_t blk) {
        for (int64_t v = blk * 4096; v < std::min(V, (blk + 1) * 4096); ++v) {
          const float b = fm::lanes32_sum(r, [&](int64_t j) { return fm::mul(bf(e[j]), bf(HM[v * r + j])); });
          lk[v] = fm::add(lk[v], b);
        }
      });
      int32_t best = 0;
      if (pick_) {
        best = (*pick_)(k, lk);
        FB_CHECK(best >= 0 && best < V) << "draft picker chose " << best;
      } else {
        for (int64_t v = 1; v < V; ++v)
          if (lk[v] > lk[best]) best = int32_t(v);
      }
      // f32([hH | e]) . w_c over the concatenated D + r vector
      const float z = fm::lanes32_sum(D + r, [&](int64_t i) {
        const float a = i < D ? bf(hH_[size_t((k - 1) * D + i)]) : bf(e[i - D]);
        return fm::mul(a, bf(WC[i]));
      });
      out_.confidence.push_back(z);
      out_.ids.push_back(best);
      prev = best;
    }
    out_.logits = std::move(U_);
  }

  DraftOutput take_output() { return std::move(out_); }

 private:
  SessionCache& s_;
  int32_t anchor_;
  int64_t p_;
  const model::DraftPicker* pick_;  // nullptr: greedy chain
  std::vector<bf16_t> hH_;
  std::vector<float> U_;
  DraftOutput out_;
};

void CpuModel::draft_commit_cpu(SessionCache& s, int64_t first_pos, const uint16_t* tap_rows, int64_t n) const {
  const Config& c = cfg_;
  const int64_t D = c.dim, hd = c.head_dim, G = int64_t(c.dspark_target_layer_ids.size()) * D;
  std::vector<bf16_t> a(static_cast<size_t>(D)), mx(static_cast<size_t>(D)), kv(static_cast<size_t>(hd));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = first_pos + i;
    fp8_gemm(tap_rows + i * G, 1, w_.draft.main_proj.w, w_.draft.main_proj.scale, a.data());
    rms_norm(a.data(), D, bfp(w_.draft.main_norm), c.norm_eps, mx.data());
    for (int st = 0; st < c.n_mtp_layers; ++st) {
      const auto& lw = w_.layers[size_t(c.n_layers + st)];
      std::vector<bf16_t> t(static_cast<size_t>(hd));
      fp8_gemm(mx.data(), 1, lw.wkv.w, lw.wkv.scale, t.data());
      rms_norm(t.data(), hd, bfp(lw.kv_norm), c.norm_eps, kv.data());
      apply_rope(kv.data(), hd, rope_plain_, p, false);
      Ring& ring = s.draft_rings[size_t(st)];
      uint8_t* b = ring.slot(p);
      fp8_qdq_row(kv.data(), hd, b, b + hd, nullptr);
      ring.pos[size_t(p % ring.slots)] = p;
    }
  }
}

DraftOutput CpuModel::draft_cpu(SessionCache& s, int32_t anchor, const uint16_t* tap_row, int64_t p,
                                const model::DraftPicker* pick) const {
  draft_commit_cpu(s, p, tap_row, 1);
  CpuDraftStep ex(*this, s, anchor, p, pick);
  model::run_draft(ex, cfg_);
  return ex.take_output();
}

}  // namespace fb::cpu
