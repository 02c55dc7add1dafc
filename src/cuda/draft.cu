// The DSpark draft block on the GPU (CudaDraftStep, the mirror of cpu::CpuDraftStep), and the
// executor's draft_commit / draft entry points.
#include "cuda/layer_ops.h"

namespace fb::cuda {

// ---------------------------------------------------------------------------------------------
// DSpark draft blocks (cpu::CpuDraftStep) of one or more sessions: B rows per session at
// p+1..p+B, keys = that session's stage ring in SLOT order, then its own block rows. Rows of
// different sessions share the weights' reads and nothing else (draft_many).
class CudaDraftStep : public CudaLayerOps {
 public:
  struct Job {
    CudaSession* s = nullptr;
    int32_t anchor = 0;
    int64_t p = 0;
    bool logits = true;  // download this block's Markov-corrected rows (model::DraftJob::want_logits)
  };
  CudaDraftStep(const CudaExecutor& m, std::vector<Job> jobs)
      : CudaLayerOps(m, int64_t(jobs.size()) * m.cfg_.dspark_block_size), jobs_(std::move(jobs)), B_(m.cfg_.dspark_block_size) {
    std::vector<int64_t> pos(static_cast<size_t>(T_));
    for (size_t j = 0; j < jobs_.size(); ++j)
      for (int64_t k = 0; k < B_; ++k) pos[j * size_t(B_) + size_t(k)] = jobs_[j].p + 1 + k;
    set_rows(pos, std::vector<uint8_t>(size_t(T_), 0));
  }

  void embed() {
    ProfScope prof_scope_(this, "embed");
    std::vector<uint64_t> src;
    for (const Job& j : jobs_)
      for (int64_t k = 0; k < B_; ++k) src.push_back(addr(m_.embed_ + int64_t(k == 0 ? j.anchor : c_.dspark_noise_token_id) * c_.dim));
    embed_tokens(src);
  }

  void attention(int l) {
    OpScope op_scope_(this, "attention");
    if (no_rows()) return;
    const DevLayer& w = m_.layers_[size_t(l)];
    const int64_t hd = c_.head_dim;
    std::vector<uint64_t> win;
    std::vector<int32_t> off{0};
    int max_keys = 0;
    for (size_t j = 0; j < jobs_.size(); ++j) {
      const DevRing& ring = jobs_[j].s->draft_rings[size_t(l - c_.n_layers)];
      const int64_t n = std::min<int64_t>(c_.window_size, jobs_[j].p + 1);
      const uint8_t* block = kv_codes_ + int64_t(j) * B_ * row_bytes();
      for (int64_t t = 0; t < B_; ++t) {
        for (int64_t slot = 0; slot < n; ++slot) win.push_back(addr(ring.data.get<uint8_t>() + slot * ring.row_bytes));
        for (int64_t k = 0; k < B_; ++k) win.push_back(addr(block + k * row_bytes()));
        off.push_back(int32_t(win.size()));
      }
      max_keys = std::max(max_keys, int(n + B_));
    }
    AttnKeys keys;
    std::tie(keys.win, keys.win_off) = upload_all(win, off);
    attend(l, keys, max_keys, w.attn_sink, float(1.0 / std::sqrt(double(hd))));
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
  // device, so the chain never waits for the host), raw confidence logits; each session's chain
  // over its own rows.
  void markov_chain() {
    ProfScope prof_scope_(this, "markov_chain");
    if (!ok()) return;
    const int64_t V = c_.vocab_size, D = c_.dim, J = int64_t(jobs_.size());
    const int r = c_.dspark_markov_rank;
    std::vector<int32_t> first(size_t(J * (B_ + 1)));
    for (int64_t j = 0; j < J; ++j) std::fill_n(first.begin() + j * (B_ + 1), B_ + 1, jobs_[size_t(j)].anchor);
    int32_t* ids = upload(first);  // [J, B + 1]
    float* conf = alloc<float>(T_);
    // one launch per chain token (markov_step: the same bits as the three kernels, which stay
    // for shapes it does not take)
    const bool fused = m_.markov_step_ && markov_step_fits(V, r, m_.draft_.markov_embed, m_.draft_.markov_head);
    MarkovScratch ms;
    if (fused) {
      ms.ctas = markov_step_ctas();
      ms.part_v = alloc<float>(ms.ctas);
      ms.part_i = alloc<int64_t>(ms.ctas);
      ms.counter = alloc<unsigned>(1);
      if (ok()) step(cuda_status(cudaMemsetAsync(ms.counter, 0, sizeof(unsigned), st_), "markov counter"));
    }
    if (!ok()) return;
    for (int64_t j = 0; j < J; ++j) {
      int32_t* idj = ids + j * (B_ + 1);
      for (int64_t k = 1; k <= B_; ++k) {
        const int64_t t = j * B_ + k - 1;
        float* lk = U_ + t * V;
        if (fused) {
          step(markov_step(lk, V, r, m_.draft_.markov_embed, m_.draft_.markov_head, idj + k - 1, hH_ + t * D, D, m_.draft_.confidence, idj + k,
                           conf + t, ms, st_));
          continue;
        }
        step(markov_bias(lk, V, r, m_.draft_.markov_embed, m_.draft_.markov_head, idj + k - 1, st_));
        step(argmax(lk, V, idj + k, st_));
        step(confidence(hH_ + t * D, D, m_.draft_.markov_embed, r, idj + k - 1, m_.draft_.confidence, conf + t, st_));
      }
    }
    download(ids_, ids, J * (B_ + 1));
    download(conf_, conf, T_);
    // the rows only when some job reads them (2.6 MB a released-size block: greedy blocks skip them)
    if (std::any_of(jobs_.begin(), jobs_.end(), [](const Job& j) { return j.logits; })) download(logits_, U_, T_ * V);
    sync();
  }

  // The block of job j.
  model::DraftOutput take_output(size_t j) {
    if (j == 0) flush_profile();
    model::DraftOutput o;
    const int64_t V = c_.vocab_size, J = int64_t(jobs_.size());
    const bool rows = jobs_[j].logits;
    if (int64_t(ids_.size()) != J * (B_ + 1) || int64_t(conf_.size()) != T_ || (rows && int64_t(logits_.size()) != T_ * V)) return o;
    o.ids.assign(ids_.begin() + int64_t(j) * (B_ + 1), ids_.begin() + int64_t(j + 1) * (B_ + 1));
    o.confidence.assign(conf_.begin() + int64_t(j) * B_, conf_.begin() + int64_t(j + 1) * B_);
    if (rows) o.logits.assign(logits_.begin() + int64_t(j) * B_ * V, logits_.begin() + int64_t(j + 1) * B_ * V);
    return o;
  }

 private:
  std::vector<Job> jobs_;
  int64_t B_;
  uint16_t* hH_ = nullptr;
  float* U_ = nullptr;
  std::vector<int32_t> ids_;
  std::vector<float> conf_, logits_;
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
  model::DraftJob job;
  job.session = &state;
  job.anchor = anchor;
  job.tap_row = tap_row;
  job.p = p;
  std::vector<Result<model::DraftOutput>> out = draft_many({job});
  return std::move(out[0]);
}

// The jobs' blocks in steps of at most kDraftMaxRows rows (whole blocks): the fast class's kernels
// take up to 64 rows, so a block's bits are the same alone or beside others (row invariance); the
// exact class's kernels are row-invariant at any size. Sampled jobs keep the default draft_sampled
// rule over their greedy block (model::keep_agreeing_picks).
std::vector<Result<model::DraftOutput>> CudaExecutor::draft_many(const std::vector<model::DraftJob>& jobs) {
  std::vector<Result<model::DraftOutput>> out(jobs.size(), Result<model::DraftOutput>(FB_ERROR(kInternal) << "draft not run"));
  const int64_t B = cfg_.dspark_block_size;
  std::vector<CudaDraftStep::Job> todo;
  std::vector<size_t> index;  // job index of each todo entry
  for (size_t i = 0; i < jobs.size(); ++i) {
    const model::DraftJob& j = jobs[i];
    auto* s = dynamic_cast<CudaSession*>(j.session);
    Status st;
    if (!s) st = FB_ERROR(kInvalidArgument) << "session was not made by the CUDA executor";
    else if (cfg_.n_mtp_layers == 0 || B <= 0) st = FB_ERROR(kUnsupported) << "this model has no DSpark stages";
    for (size_t k = 0; st.ok() && k < i; ++k)
      if (jobs[k].session == j.session) st = FB_ERROR(kInvalidArgument) << "draft_many: one session in two jobs";
    // The ring write of p from g(p) before any block reads the rings.
    if (st.ok()) st = draft_commit(*s, j.p, j.tap_row, 1);
    if (st.ok()) st = rope_plain_.ensure(j.p + B + 1, stream_);
    if (st.ok()) st = rope_yarn_.ensure(j.p + B + 1, stream_);
    if (!st.ok()) {
      out[i] = st;
      continue;
    }
    todo.push_back({s, j.anchor, j.p, j.want_logits || j.pick != nullptr});
    index.push_back(i);
  }
  constexpr int64_t kDraftMaxRows = 64;  // layer_ops.h kFastGemvMaxRows
  const size_t per_step = size_t(std::max<int64_t>(1, kDraftMaxRows / std::max<int64_t>(1, B)));
  for (size_t g = 0; g < todo.size(); g += per_step) {
    const size_t n = std::min(per_step, todo.size() - g);
    CudaDraftStep ex(*this, std::vector<CudaDraftStep::Job>(todo.begin() + int64_t(g), todo.begin() + int64_t(g + n)));
    Status st = ex.status();
    if (st.ok()) {
      model::run_draft(ex, cfg_);
      st = ex.status();
    }
    for (size_t k = 0; k < n; ++k) {
      const size_t i = index[g + k];
      if (!st.ok()) {
        out[i] = st;
        continue;
      }
      model::DraftOutput d = ex.take_output(k);
      if (jobs[i].pick) model::keep_agreeing_picks(d, *jobs[i].pick);
      out[i] = std::move(d);
    }
  }
  return out;
}

}  // namespace fb::cuda
