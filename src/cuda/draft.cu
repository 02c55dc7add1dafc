// The DSpark draft block on the GPU (CudaDraftStep, the mirror of cpu::CpuDraftStep), and the
// executor's draft_commit / draft entry points.
#include "cuda/layer_ops.h"

namespace fb::cuda {

// ---------------------------------------------------------------------------------------------
// DSpark draft block (cpu::CpuDraftStep): B rows at p+1..p+B, keys = the stage's ring in SLOT
// order, then the block rows.
class CudaDraftStep : public CudaLayerOps {
 public:
  CudaDraftStep(const CudaExecutor& m, CudaSession& s, int32_t anchor, int64_t p)
      : CudaLayerOps(m, m.cfg_.dspark_block_size), s_(s), anchor_(anchor), p_(p) {
    std::vector<int64_t> pos(static_cast<size_t>(T_));
    for (int64_t k = 0; k < T_; ++k) pos[size_t(k)] = p + 1 + k;
    set_rows(pos, std::vector<uint8_t>(size_t(T_), 0));
  }

  void embed() {
    ProfScope prof_scope_(this, "embed");
    std::vector<uint64_t> src;
    for (int64_t k = 0; k < T_; ++k) src.push_back(addr(m_.embed_ + int64_t(k == 0 ? anchor_ : c_.dspark_noise_token_id) * c_.dim));
    embed_tokens(src);
  }

  void attention(int l) {
    ProfScope prof_scope_(this, "attention");
    Frame frame_(this);
    if (!ok() || T_ == 0) return;  // every row left (bounded replay)
    const DevLayer& w = m_.layers_[size_t(l)];
    const int64_t hd = c_.head_dim;
    const DevRing& ring = s_.draft_rings[size_t(l - c_.n_layers)];
    const int64_t n = std::min<int64_t>(c_.window_size, p_ + 1);
    std::vector<uint64_t> win;
    std::vector<int32_t> off{0};
    for (int64_t t = 0; t < T_; ++t) {
      for (int64_t slot = 0; slot < n; ++slot) win.push_back(addr(ring.data.get<uint8_t>() + slot * ring.row_bytes));
      for (int64_t k = 0; k < T_; ++k) win.push_back(addr(kv_codes_ + k * row_bytes()));
      off.push_back(int32_t(win.size()));
    }
    AttnKeys keys;
    std::tie(keys.win, keys.win_off) = upload_all(win, off);
    attend(keys, int(n + T_), w.attn_sink, float(1.0 / std::sqrt(double(hd))));
  }

  void head() {
    ProfScope prof_scope_(this, "head");
    if (!ok()) return;
    hH_ = alloc<uint16_t>(T_ * c_.dim);
    U_ = alloc<float>(T_ * c_.vocab_size);
    std::vector<int32_t> rows;
    for (int64_t k = 0; k < T_; ++k) rows.push_back(int32_t(k));
    head_rows(rows, m_.draft_.norm, U_, hH_);
  }

  // spec/13 §4.6-4.7: sequential Markov bias over the full vocabulary, greedy draws (on the
  // device, so the chain never waits for the host), raw confidence logits.
  void markov_chain() {
    ProfScope prof_scope_(this, "markov_chain");
    if (!ok()) return;
    const int64_t V = c_.vocab_size, D = c_.dim;
    const int r = c_.dspark_markov_rank;
    int32_t* ids = upload(std::vector<int32_t>(size_t(T_ + 1), anchor_));
    float* conf = alloc<float>(T_);
    if (!ok()) return;
    for (int64_t k = 1; k <= T_; ++k) {
      float* lk = U_ + (k - 1) * V;
      step(markov_bias(lk, V, r, m_.draft_.markov_embed, m_.draft_.markov_head, ids + k - 1, st_));
      step(argmax(lk, V, ids + k, st_));
      step(confidence(hH_ + (k - 1) * D, D, m_.draft_.markov_embed, r, ids + k - 1, m_.draft_.confidence, conf + k - 1, st_));
    }
    download(out_.ids, ids, T_ + 1);
    download(out_.confidence, conf, T_);
    download(out_.logits, U_, T_ * V);
    sync();
  }

  model::DraftOutput take_output() {
    flush_profile();
    return std::move(out_);
  }

 private:
  CudaSession& s_;
  int32_t anchor_;
  int64_t p_;
  uint16_t* hH_ = nullptr;
  float* U_ = nullptr;
  model::DraftOutput out_;
};

Status CudaExecutor::draft_commit(model::SessionState& state, int64_t first_pos, const uint16_t* tap_rows, int64_t n) {
  auto* s = dynamic_cast<CudaSession*>(&state);
  if (!s) return FB_ERROR(kInvalidArgument) << "session was not made by the CUDA executor";
  FB_RETURN_IF_ERROR(s->ensure_allocated(stream_));
  if (n <= 0 || cfg_.n_mtp_layers == 0) return Status();
  const Config& c = cfg_;
  const int64_t D = c.dim, hd = c.head_dim, G = int64_t(c.dspark_target_layer_ids.size()) * D, rb = hd + hd / 32;
  FB_RETURN_IF_ERROR(rope_plain_.ensure(first_pos + n, stream_));
  Status st;
  Arena arena(stream_, &ws_);
  std::vector<uint16_t> taps(tap_rows, tap_rows + n * G);
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) pos[size_t(i)] = first_pos + i;
  const uint16_t* x = arena.upload(taps, st);
  const int64_t* pos_d = arena.upload(pos, st);
  uint16_t* a = arena.alloc<uint16_t>(n * D, st);
  uint16_t* mx = arena.alloc<uint16_t>(n * D, st);
  uint16_t* t = arena.alloc<uint16_t>(n * hd, st);
  uint16_t* kv = arena.alloc<uint16_t>(n * hd, st);
  uint8_t* codes = arena.alloc<uint8_t>(n * rb, st);
  QuantBuf q;
  q.capacity = n * std::max(G, D);
  q.codes = arena.alloc<uint8_t>(q.capacity, st);
  q.scales = arena.alloc<float>(q.capacity / 32 + 1, st);
  FB_RETURN_IF_ERROR(st);
  FB_RETURN_IF_ERROR(fp8_gemm(x, n, draft_.main_proj, a, q, stream_));
  FB_RETURN_IF_ERROR(rms_norm(a, n, D, draft_.main_norm, c.norm_eps, mx, stream_));
  for (int stage = 0; stage < c.n_mtp_layers; ++stage) {
    const DevLayer& lw = layers_[size_t(c.n_layers + stage)];
    DevRing& ring = s->draft_rings[size_t(stage)];
    FB_RETURN_IF_ERROR(fp8_gemm(mx, n, lw.wkv, t, q, stream_));
    FB_RETURN_IF_ERROR(rms_norm(t, n, hd, lw.kv_norm, c.norm_eps, kv, stream_));
    FB_RETURN_IF_ERROR(rope(kv, n, 1, hd, c.rope_head_dim, pos_d, rope_plain_.cos.get<float>(), rope_plain_.sin.get<float>(), false, stream_));
    FB_RETURN_IF_ERROR(fp8_qdq(kv, n, hd, codes, rb, nullptr, stream_));
    std::map<int64_t, int64_t> last;  // slot -> row
    for (int64_t i = 0; i < n; ++i) {
      last[(first_pos + i) % ring.slots] = i;
      ring.pos[size_t((first_pos + i) % ring.slots)] = first_pos + i;
    }
    std::vector<uint64_t> src, dst;
    for (auto [slot, i] : last) {
      src.push_back(addr(codes + i * rb));
      dst.push_back(addr(ring.data.get<uint8_t>() + slot * ring.row_bytes));
    }
    const uint64_t* src_d = arena.upload(src, st);
    const uint64_t* dst_d = arena.upload(dst, st);
    FB_RETURN_IF_ERROR(st);
    FB_RETURN_IF_ERROR(copy_rows(src_d, dst_d, int64_t(src.size()), rb, stream_));
  }
  FB_CUDA_TRY(cudaStreamSynchronize(stream_));
  return Status();
}

Result<model::DraftOutput> CudaExecutor::draft(model::SessionState& state, int32_t anchor, const uint16_t* tap_row, int64_t p) {
  auto* s = dynamic_cast<CudaSession*>(&state);
  if (!s) return FB_ERROR(kInvalidArgument) << "session was not made by the CUDA executor";
  if (cfg_.n_mtp_layers == 0) return FB_ERROR(kUnsupported) << "this model has no DSpark stages";
  FB_RETURN_IF_ERROR(draft_commit(*s, p, tap_row, 1));
  FB_RETURN_IF_ERROR(rope_plain_.ensure(p + cfg_.dspark_block_size + 1, stream_));
  FB_RETURN_IF_ERROR(rope_yarn_.ensure(p + cfg_.dspark_block_size + 1, stream_));
  model::DraftOutput out;
  {
    CudaDraftStep ex(*this, *s, anchor, p);
    FB_RETURN_IF_ERROR(ex.status());
    model::run_draft(ex, cfg_);
    FB_RETURN_IF_ERROR(ex.status());
    out = ex.take_output();
  }
  return out;
}

}  // namespace fb::cuda
