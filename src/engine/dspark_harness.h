// Forced-acceptance harness for the DSpark speed model (issue 11): a BENCH/TEST wrapper executor
// whose drafts are the target's own greedy continuation with probability p each (else a token
// that is certainly wrong), so greedy rounds accept a truncated-geometric number of drafts and
// tokens per round can be checked against 1 + sum_{j<=L} p^j. The real draft still runs (its
// cost is measured); only its ids and confidences are replaced. Never serves requests.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "base/status.h"
#include "engine/generator.h"
#include "model/executor.h"

namespace fb::engine {

class ForcedAcceptanceExecutor final : public model::Executor {
 public:
  // transcript[pos] = the target's greedy token at position pos (prompt + plain greedy output);
  // positions past its end get wrong drafts. Confidence logits are set to logit(p), so a
  // calibrated scheduler sees c_k = p.
  ForcedAcceptanceExecutor(model::Executor& inner, std::vector<int32_t> transcript, double p, uint64_t seed);
  const model::Config& config() const override { return in_->config(); }
  const char* name() const override { return "forced-acceptance"; }
  std::unique_ptr<model::SessionState> new_session() const override { return in_->new_session(); }
  Result<model::StepOutput> forward(const model::Step& step, const std::vector<model::SessionState*>& sessions,
                                    model::Taps* taps = nullptr) override {
    return in_->forward(step, sessions, taps);
  }
  Status draft_commit(model::SessionState& s, int64_t first_pos, const uint16_t* rows, int64_t n) override {
    return in_->draft_commit(s, first_pos, rows, n);
  }
  Result<model::DraftOutput> draft(model::SessionState& s, int32_t anchor, const uint16_t* tap_row, int64_t p) override;

 private:
  model::Executor* in_;
  std::vector<int32_t> transcript_;
  double p_;
  uint64_t seed_;
};

struct ForcedAcceptanceReport {
  double p = 0;                         // forced per-draft acceptance
  int64_t rounds = 0, accepted = 0, verify_rows = 0;
  double tokens_per_round = 0;          // (accepted + rounds) / rounds
  double expected_tokens_per_round = 0; // speed model: mean over rounds of 1 + sum_{j<=L} p^j
  std::vector<int64_t> accepted_hist, verify_hist;
  double draft_s = 0, verify_s = 0, decode_s = 0;
  int64_t backoff_steps = 0;            // plain steps taken because drafting did not pay (scheduled runs)
  double tok_per_s = 0;                 // generated tokens / decode wall time (DSpark on)
  double plain_tok_per_s = 0;           // the same generation with DSpark off
  bool matches_plain = false;           // greedy output equal to plain greedy (exactness)
};

// Plain greedy generation of n_tokens after `prompt` (the transcript and the baseline speed),
// then DSpark greedy with forced acceptance p for each p in ps. `opt` sets the schedule (force
// dspark_verify for a fixed L, or give/measure a cost table). Deterministic for a given seed.
// on_run (optional): (runs done, runs in all) after the plain run and after each p.
Result<std::vector<ForcedAcceptanceReport>> run_forced_acceptance(model::Executor& ex, std::span<const int32_t> prompt,
                                                                  int64_t n_tokens, std::span<const double> ps,
                                                                  GeneratorOptions opt, uint64_t seed = 1,
                                                                  const std::function<void(int64_t, int64_t)>& on_run = {});

}  // namespace fb::engine
