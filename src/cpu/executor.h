// CpuModel: the reference executor. Plain loops over rows (threads over rows/outputs only), the
// arithmetic of cpu/ops.h, the layer order of model/forward.h. It defines what every faster
// path must reproduce; it is checked against the official fixtures (check-fixture).
#pragma once

#include <atomic>
#include <mutex>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpu/ops.h"
#include "cpu/session_cache.h"
#include "loader/snapshot.h"
#include "model/config.h"
#include "model/engram_constants.h"
#include "model/engram_staging.h"
#include "model/executor.h"
#include "model/step.h"
#include "model/weights.h"

namespace fb::cpu {

using model::DraftOutput;
using model::Taps;

class CpuModel final : public model::Executor {
 public:
  // Loads and validates the snapshot; `token_map` overrides the map file beside the config.
  static Result<std::unique_ptr<CpuModel>> load(const std::string& dir, std::vector<int32_t> token_map = {});
  CpuModel(std::unique_ptr<loader::Snapshot> snap, std::vector<int32_t> token_map);

  const model::Config& config() const override { return cfg_; }
  const char* name() const override { return "cpu"; }
  bool supports_bounded_replay() const override { return cfg_.decoder_start >= 0; }
  bool packs_prompts() const override { return true; }  // rows are computed per row and session
  // Counted in stats()' memory ledger while it lives.
  std::unique_ptr<model::SessionState> new_session() const override {
    auto s = std::make_unique<SessionCache>(cfg_);
    s->track(sessions_);
    return s;
  }
  Result<model::StepOutput> forward(const model::Step& step, const std::vector<model::SessionState*>& sessions,
                                    Taps* taps = nullptr) override;
  Status draft_commit(model::SessionState& s, int64_t first_pos, const uint16_t* tap_rows, int64_t n) override {
    draft_commit_cpu(static_cast<SessionCache&>(s), first_pos, tap_rows, n);
    return Status();
  }
  Result<DraftOutput> draft(model::SessionState& s, int32_t anchor, const uint16_t* tap_row, int64_t p) override {
    return draft_cpu(static_cast<SessionCache&>(s), anchor, tap_row, p);
  }
  Result<DraftOutput> draft_sampled(model::SessionState& s, int32_t anchor, const uint16_t* tap_row, int64_t p,
                                    const model::DraftPicker& pick) override {
    return draft_cpu(static_cast<SessionCache&>(s), anchor, tap_row, p, &pick);
  }
  // The vision tower on the CPU (vision::VisionTower: the reference-defining numerics).
  Result<std::vector<uint16_t>> encode_image(const std::vector<uint16_t>& patches, int nvh, int nvw,
                                             std::vector<uint16_t>* vit = nullptr) override;
  Result<std::vector<uint16_t>> image_span_markers() const override;
  // SessionCache::serialize / restore under this model's identity (model_id()).
  Result<std::string> save_session(const model::SessionState& s) const override {
    return static_cast<const SessionCache&>(s).serialize(model_id_);
  }
  Status restore_session(model::SessionState& s, std::string_view bytes) const override {
    return static_cast<SessionCache&>(s).restore(bytes, model_id_);
  }
  // 64-bit FNV-1a of the snapshot's config.json and index (a session restores only into the
  // model that wrote it).
  uint64_t model_id() const { return model_id_; }
  uint64_t identity() const override { return model_id_; }
  const model::ModelWeights& weights() const { return w_; }
  const std::vector<int32_t>& token_map() const { return token_map_; }
  const loader::Snapshot& snapshot() const { return *snap_; }

  // Replace where routed experts come from (tiered stores); default: the mapped snapshot. The
  // memory ledger then leaves the routed-expert tensors out of the host weights.
  void set_expert_source(std::shared_ptr<const model::ExpertSource> src);
  // Engram table rows from a drive-backed source (storage::EngramRowCache, issue 22) instead of
  // the mapping: the same bytes; the ledger then counts the source's cache, not the tables.
  void set_engram_source(std::shared_ptr<const model::EngramRowSource> src) { engram_source_ = std::move(src); }

  // Runs the backbone over `step.rows`; sessions[i] is the state of row.session == i. Appends
  // the rows to their sessions (positions advance). Validates row/session consistency.
  // `op_times` (optional) receives each op's wall time by family (model/timed_ops.h),
  // `engram_rows` (optional) the Engram rows read, hidden or exposed (model/executor_stats.h).
  Result<model::StepOutput> forward_cpu(const model::Step& step, const std::vector<SessionCache*>& sessions, Taps* taps = nullptr,
                                        model::OpTimes* op_times = nullptr, model::EngramRows* engram_rows = nullptr) const;
  // Expert traffic of a tiered source (set_expert_source), the op times and Engram rows of
  // forward() steps, and the memory ledger by tier: host weights (the snapshot's mapped tensors,
  // routed experts left out under tiers), the dequantised wo_a copies, the live sessions' caches,
  // the tables kept between steps (RoPE, Engram hashing), the tiers' expert buffers; drives: the
  // expert bytes the tiers read; no HBM.
  model::ExecutorStats stats() const override;
  // Engram rows fetched ahead of their layer by a task started at the step's hashing (default
  // on); off: each Engram op fetches its own rows (the same bytes; every row exposed).
  void set_engram_prefetch(bool on) { engram_prefetch_ = on; }
  // Cache-conditional routing [approx-approved], off by default (cpu/ops.h RoutePreference): with
  // margin > 0, a chosen expert that resident(layer, e) says is not resident gives way to an
  // unchosen resident one within `margin` of its biased score. The outputs then depend on what the
  // tiers hold (history), not on the rows alone: for measuring its cost (replay-quality).
  void set_route_preference(float margin, std::function<bool(int, int)> resident) {
    route_margin_ = margin;
    route_resident_ = std::move(resident);
  }
  int64_t route_swaps() const { return route_swaps_.load(); }  // experts replaced so far
  // Next-layer prediction (issue 22, [exact]; off by default): once a layer's experts have run,
  // each row is routed through the next backbone layer's gate on this layer's expert input and the
  // guesses go to the expert source's prefetch (a tiered source starts their drive reads a layer
  // early; the mapped snapshot ignores the hint). Only when bytes arrive changes.
  void set_expert_predict(bool on) { expert_predict_ = on; }
  // Distinct experts handed to the source, and the routing's (row, expert) picks of the guessed
  // layers and how many of them the guess held (the guess's recall), so far. Shared: a caller may
  // read them after the model is gone.
  struct PredictCounts {
    std::atomic<int64_t> hints{0}, picks{0}, guessed{0};
  };
  std::shared_ptr<const PredictCounts> predict_counts() const { return predict_recall_; }

  // DSpark: seed the draft rings with committed positions (tap rows bf16 [n, n_taps*dim] for
  // positions first_pos..first_pos+n-1); the prefill's draft call.
  void draft_commit_cpu(SessionCache& s, int64_t first_pos, const uint16_t* tap_rows, int64_t n) const;
  // The reference's forward_spec(anchor, g(p), p): writes ring slot p from tap_row, then drafts;
  // `pick` (optional) draws the chain tokens instead of argmax (sampled drafts, spec/13 §4.6).
  DraftOutput draft_cpu(SessionCache& s, int32_t anchor, const uint16_t* tap_row, int64_t p,
                        const model::DraftPicker* pick = nullptr) const;

 private:
  friend class CpuLayerOps;
  friend class CpuStep;
  friend class CpuDraftStep;
  std::unique_ptr<loader::Snapshot> snap_;
  model::Config cfg_;
  model::ModelWeights w_;
  std::shared_ptr<const model::ExpertSource> experts_;
  std::vector<int32_t> token_map_;
  int32_t pad_class_ = 0;
  uint64_t model_id_ = 0;
  std::vector<model::EngramTableConstants> engram_;
  model::RopeTable rope_plain_, rope_yarn_;
  std::vector<std::vector<bf16_t>> wo_a_bf16_;  // per layer, dequantised once (the reference holds BF16)
  // forward()'s steps by op family: always on ([policy]: two clock reads per op, measured at
  // well under 1% of a tiny-model step, docs/serving.md); forward_cpu callers opt in.
  model::OpTimes op_times_;
  model::EngramRows engram_rows_;  // forward()'s steps
  bool engram_prefetch_ = true;
  std::shared_ptr<const model::EngramRowSource> engram_source_;
  // Engram rows staged ahead by a worker kept across steps (model/engram_staging.h); one step at
  // a time uses it (staging_mu_, held for the step).
  mutable model::EngramStaging engram_staging_;
  mutable std::mutex staging_mu_;
  bool expert_predict_ = false;
  std::shared_ptr<PredictCounts> predict_recall_ = std::make_shared<PredictCounts>();
  float route_margin_ = 0.0f;
  std::function<bool(int, int)> route_resident_;
  mutable std::atomic<int64_t> route_swaps_{0};
  // Memory ledger: the live sessions new_session() made; host weight bytes with every tensor
  // mapped, and with the routed experts left out (served by a tiered source).
  std::shared_ptr<SessionRegistry> sessions_ = std::make_shared<SessionRegistry>();
  uint64_t weight_bytes_all_ = 0, weight_bytes_no_experts_ = 0;
  bool experts_tiered_ = false;
};

}  // namespace fb::cpu
