// Generator: token-level generation for one sequence on a model::Executor: chunked prefill (with
// prefix reuse of the session's cache), plain decode, and the DSpark loop of spec/13 §5-7 (draft
// a block, schedule the verify length, verify anchor + drafts in ONE step of kDecode rows, accept
// (greedy prefix match, or exact rejection sampling when temperature > 0), roll the target back,
// commit accepted tap rows to the draft rings). No tokenizer, no threads: the Engine drives it.
// Invariants: greedy output is the same with DSpark on or off (verify rows use decode
// arithmetic; acceptance uses argmax with lowest-id ties); sampled output has the distribution
// of plain sampling (spec/13 §6.2; the verify length never looks at acceptance draws).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "engine/dspark_schedule.h"
#include "engine/kv_store.h"
#include "engine/sampler.h"
#include "model/executor.h"

namespace fb::engine {

struct GeneratorOptions {
  int prefill_chunk = 0;  // rows per prefill step; 0: the executor's preferred_prefill_chunk()
  bool dspark = true;       // use the draft loop (greedy and sampled) when the model has DSpark
  int dspark_verify = -1;   // forced drafted rows verified per round (0..B); -1 = the scheduler
  // Verify cost table for the scheduler (spec/13 §7): steps/s of a verify step with 1..B+1 rows.
  // Empty: measured on the live session at the first DSpark round (calibrate_verify_cost).
  std::vector<double> dspark_verify_sps;
  double dspark_draft_s = 0;  // seconds per draft block for the back-off rule (0: measured with the table)
  int dspark_calibrate_reps = 2;         // timed repetitions per row count (min taken)
  // [policy] When a scheduled round finds that drafting does not pay (drafting_pays), the next
  // rounds decode plainly: 1, 2, 4, ... up to this many steps, reset by a round that pays. 0 = never
  // back off. Forced lengths (dspark_verify >= 0) never back off.
  int dspark_max_backoff = 8;
  std::vector<double> dspark_sts_temps;  // confidence temperatures T_1..T_B (spec/13 §4.8); empty: 1
  int64_t max_context = 0;  // 0 = the model's max_position_embeddings
  // [approx-approved] SWA bounded replay (spec/11 §8.4): a prompt longer than the window runs
  // its decoder layers only over the last `window` positions. Off: exact prefill.
  bool prefill_replay = false;
  // Disk KV cache (issue 21; engine/kv_store.h): prefill restores the longest stored prefix of a
  // text prompt before computing the rest, and stores the prompt's state when it is done.
  // Executors that cannot serialize their sessions leave it unused.
  std::shared_ptr<KvStore> kv_store;
  // ... and, with a store, checkpoints the whole conversation (prompt and generated tokens) at the
  // end of a request and every this many generated tokens (0: only at the end), so the next turn,
  // which resends the answer, restores it too (delta checkpoints keep these cheap).
  int64_t kv_checkpoint_every = 4096;
};

// Prompt positions that enter the forward pass with an embedding instead of their token's
// (image spans, spec/14 §6). Every span id is the same image_token_id, so `key` tells cached
// positions apart: prefix reuse needs equal ids AND equal keys (different images never share KV).
struct PromptEmbeddings {
  std::vector<int32_t> row;    // [prompt len] row of `data`, -1 = a text position
  std::vector<uint64_t> key;   // [prompt len] 0 = text, else a content key (image hash and slot)
  std::vector<uint16_t> data;  // bf16 [rows, dim] (sized for every row; see prepare)
  // Optional: called by Generator::prefill once it knows the first position it will compute
  // (after prefix reuse), before any row is read; it must fill the data rows of every position
  // at or after it. Lets the engine skip the vision tower for images whose KV is reused.
  std::function<Status(int64_t first_pos)> prepare;
};

struct DsparkCounters {
  int64_t steps = 0;          // draft + verify rounds
  int64_t proposals = 0;      // drafted tokens offered to verification
  int64_t accepted = 0;       // drafted tokens accepted
  int64_t verify_rows = 0;    // target rows run by verification (anchor included)
  int64_t sampled_steps = 0;  // rounds decided by rejection sampling (temperature > 0)
  int64_t residual_draws = 0; // sampled rounds that ended in a rejection (residual draw)
  std::vector<int64_t> accepted_hist;  // [B + 1] rounds that accepted a drafts
  std::vector<int64_t> verify_hist;    // [B + 1] rounds that verified L drafts (the schedule)
  // time drafting (chain draws included; in a shared round, from the session's draft request to the
  // end of the round's one draft call) / verifying
  double draft_s = 0, verify_s = 0;
  double calibrate_s = 0;              // time measuring the verify cost table
  int64_t backoff_steps = 0;           // plain decode steps taken because drafting did not pay
  // this += now - before (per-request deltas of a generator's running counters).
  void add_since(const DsparkCounters& now, const DsparkCounters& before);
};

class Generator {
 public:
  Generator(model::Executor& ex, GeneratorOptions opt);

  // The first row of a `rows`-row prefill step whose DSpark taps the generator reads (it keeps the
  // last window + 16 of them and commits the last window): model::Step::taps_from_row.
  static int64_t prefill_taps_from_row(int64_t rows, int64_t window);

  // Prepares the session for `prompt`: keeps the longest common prefix the cache can roll back
  // to, prefills the rest in chunks. progress(done, total) after each chunk; returning false
  // cancels (kCancelled). Errors: empty prompt, id outside the vocabulary, context overflow.
  // `embeds` (optional): image rows of the prompt; they may fall in any chunk.
  // (One generator driving begin_prefill / plan_prefill / finish_prefill alone.)
  Status prefill(std::span<const int32_t> prompt, const std::function<bool(int64_t, int64_t)>& progress = {},
                 const PromptEmbeddings* embeds = nullptr);
  // Emits the next tokens (1 for plain decode, 1..B+1 for a DSpark round) into *out, with raw
  // logprobs into *logprobs when top_n >= 0. At the context limit returns kResourceExhausted.
  // (One generator driving plan_next / finish_next alone.)
  Status next(const SamplingParams& sp, Rng& rng, std::vector<int32_t>* out, std::vector<TokenLogprob>* logprobs = nullptr,
              int top_n = -1);

  // Shared steps (issue 20): the engine builds ONE model::Step from several generators. Each
  // appends its rows (plan_*), naming its index in the step's session list; the engine runs the
  // step once and hands each generator the outputs of its own rows (rows_of), finish_*. Rows of
  // one generator are contiguous. prefill() and next() above are the one-generator case.
  //
  // Reuse, disk KV restore and validation for `prompt`; runs nothing. `prompt` is copied;
  // `embeds` must outlive the prefill.
  Status begin_prefill(std::span<const int32_t> prompt, const PromptEmbeddings* embeds = nullptr);
  int64_t prefill_rows_left() const { return pf_end_ - pf_next_; }
  int64_t prefill_done() const { return pf_next_ - reused_; }    // rows prefilled by this prompt so far
  int64_t prefill_total() const { return pf_end_ - reused_; }    // rows this prompt prefills
  // Appends the next min(max_rows, prefill_rows_left()) prompt rows. They must come before every
  // decode row of the step. Opening the step, they set its taps_from_row; after another session's
  // prompt rows (Executor::packs_prompts) they get every tap row, as later rows do.
  void plan_prefill(int64_t max_rows, int session, model::Step* st);
  // `mine`: the outputs of the rows plan_prefill appended. The last chunk leaves logits ready.
  Status finish_prefill(const model::StepOutput& mine);
  // After a prefill (logits ready): emits one token into *out and appends no rows. Otherwise
  // appends this round's rows (one decode row, or a DSpark verify block: the draft runs here, on
  // the session alone); finish_next then takes their outputs. kResourceExhausted at the context
  // limit (nothing appended).
  Status plan_next(const SamplingParams& sp, Rng& rng, int session, model::Step* st, std::vector<int32_t>* out,
                   std::vector<TokenLogprob>* logprobs = nullptr, int top_n = -1);
  bool awaiting_step() const { return round_.kind != Round::Kind::kNone; }
  // plan_next in two halves, so the engine can draft every DSpark session of a round in ONE
  // executor call (model::Executor::draft_many). prepare_next emits from the logits a prefill
  // left (no step, prepared() stays false, as plan_next) or decides the round: a plain decode
  // row, or a draft, whose request is draft_job() (valid until plan_drafted; it points into this
  // generator). plan_drafted appends the rows: the plain row, or, from the draft's output, the
  // scheduled verify block. plan_next = prepare_next + the draft alone + plan_drafted. `sp` must
  // stay alive and unchanged from prepare_next to plan_drafted (a sampled draft's picker uses it).
  Status prepare_next(const SamplingParams& sp, Rng& rng, std::vector<int32_t>* out, std::vector<TokenLogprob>* logprobs = nullptr,
                      int top_n = -1);
  bool prepared() const { return round_.prep != Round::Prep::kNone; }
  const model::DraftJob* draft_job() const { return round_.prep == Round::Prep::kDraft ? &round_.job : nullptr; }
  // drafted: the draft of draft_job() (moved from; null when the round decodes plainly).
  Status plan_drafted(const SamplingParams& sp, int session, model::Step* st, Result<model::DraftOutput>* drafted);
  Status finish_next(const model::StepOutput& mine, const SamplingParams& sp, Rng& rng, std::vector<int32_t>* out,
                     std::vector<TokenLogprob>* logprobs = nullptr, int top_n = -1);
  // Disk KV cache: stores the state of every cached position (the prompt and the tokens generated
  // and fed since) when it covers more than the last checkpoint and at most `max_positions`
  // positions (the prompt plus the tokens the client was given: a DSpark round may have fed
  // tokens past a max_tokens cut, and such a state is no prefix of the next turn); a no-op
  // without a store, while a round awaits its step, or for executors that cannot serialize.
  // Errors cost the checkpoint only.
  void checkpoint_history(int64_t max_positions);
  // Generated positions since the last checkpoint of this session (prompt or history).
  int64_t uncheckpointed() const { return int64_t(history_.size()) - ckpt_upto_; }
  // A shared step failed: the cache may hold part of it, so start over (drops prefix reuse).
  void abandon_step() { reset(); }
  model::SessionState* session() { return session_.get(); }

  // Positions the next emitted token will occupy / may occupy at most.
  int64_t n_generated_pos() const { return int64_t(history_.size()) + (pending_ ? 1 : 0); }
  int64_t max_context() const { return max_context_; }
  int64_t reused_tokens() const { return reused_; }
  // Of reused_tokens(), the positions the last prefill restored from the disk KV cache.
  int64_t restored_tokens() const { return restored_; }
  // Fresh cache (drops prefix reuse).
  void reset();
  // Takes the session as already holding `history` at positions [0, history.size()), written
  // there by the caller without this generator (the sessions bench fakes long contexts this way:
  // bench/fake_context.h). Nothing runs. With next_token >= 0 that token is pending: the next
  // round feeds it at position history.size(), as after an emission (a DSpark session's first
  // round then decodes plainly, since no tap row of the last position exists yet). With -1
  // nothing is pending: begin_prefill of a prompt that starts with `history` prefills only the
  // rest. [policy] benchmark use: the caller vouches that the cache matches `history`.
  // Errors: the session's position count differs from the history, ids outside the vocabulary.
  Status adopt_context(std::span<const int32_t> history, int32_t next_token);
  // Common prefix of the cached history and `prompt` that prefill() would keep (a hint for
  // choosing among several generators).
  int64_t reusable_prefix(std::span<const int32_t> prompt, const PromptEmbeddings* embeds = nullptr) const;
  const DsparkCounters& counters() const { return counters_; }
  bool dspark_available() const { return dspark_ok_; }
  // The scheduler's verify cost table (empty until given or measured).
  const VerifyCostTable& verify_cost() const { return cost_; }
  void set_verify_cost(const VerifyCostTable& t) { cost_ = t; }
  // Times target verify steps of 1..B+1 decode rows at the session's next position (after a
  // prefill or emission; each step is rolled back) and a draft block, and keeps the table; a flat
  // table when the context has no room. Runs by itself at the first scheduled round when no table
  // was given.
  Status calibrate_verify_cost();

 private:
  Status forward_rows(const model::Step& st, model::StepOutput* out);
  // Tap rows of committed positions go to the draft rings and to a short history (re-seeding
  // the rings after a prefix-reuse rollback).
  Status commit_taps(int64_t first_pos, const uint16_t* rows, int64_t n);
  void remember_taps(int64_t first_pos, const uint16_t* rows, int64_t n);
  void plan_plain(int session, model::Step* st);
  Status finish_plain(const model::StepOutput& o, const SamplingParams& sp, Rng& rng, std::vector<int32_t>* out,
                      std::vector<TokenLogprob>* lp, int top_n);
  Status prepare_draft(const SamplingParams& sp, Rng& rng);
  Status plan_verify(const SamplingParams& sp, int session, model::Step* st);
  Status finish_dspark(const model::StepOutput& o, const SamplingParams& sp, Rng& rng, std::vector<int32_t>* out,
                       std::vector<TokenLogprob>* lp, int top_n);
  // The prompt is in: the disk KV cache checkpoint (when on).
  void complete_prefill();
  // Drafted rows to verify this round (forced, or the scheduler over the confidences).
  // survival (optional): the S_j the scheduler used (empty for forced lengths).
  int64_t verify_len(const model::DraftOutput& d, bool greedy, std::vector<double>* survival = nullptr) const;
  // Emits token t: emit_token checks the response format first, emit_checked after the check.
  Status emit_token(const SamplingParams& sp, int32_t t, std::vector<int32_t>* out);
  Status emit_checked(int32_t t, std::vector<int32_t>* out);
  // Emits one token from `row` (nullptr: logits_, the prompt's last row).
  Status emit_from_logits(const SamplingParams& sp, Rng& rng, std::vector<int32_t>* out, std::vector<TokenLogprob>* lp, int top_n,
                          const float* row = nullptr);

  model::Executor* ex_;
  GeneratorOptions opt_;
  std::unique_ptr<model::SessionState> session_;
  std::vector<model::SessionState*> sess_;
  int64_t vocab_ = 0, tap_w_ = 0, window_ = 0, max_context_ = 0;
  int block_ = 0;
  bool dspark_ok_ = false;       // the model has draft stages and the option is on
  std::vector<int32_t> history_; // token at every cached position
  std::vector<uint64_t> hist_key_;  // PromptEmbeddings::key of the cached prompt (shorter: the rest is text)
  // After prefill: logits_ predict position history_.size(). After an emission: pending_ holds
  // the last emitted token, not yet fed; tap_ is the tap row of the last cached position.
  std::vector<float> logits_;
  bool have_logits_ = false;
  bool pending_ = false;
  int32_t pending_token_ = 0;
  std::vector<uint16_t> tap_;
  std::vector<uint16_t> tap_hist_;     // bf16 [window + 16, tap_w], slot = pos % slots
  std::vector<int64_t> tap_hist_pos_;  // position held by each slot, -1 none
  int64_t reused_ = 0;
  int64_t restored_ = 0;
  int64_t ckpt_upto_ = 0;  // history_ positions the last stored checkpoint covers
  DsparkCounters counters_;
  VerifyCostTable cost_;
  GeneratedTokens generated_;  // tokens emitted since the last prefill (penalties, phrase bias)
  std::vector<float> processed_;  // a logits row after SamplingParams' bias, penalties and mask (scratch)
  std::vector<uint32_t> allowed_;  // the constraint's mask for that row (scratch)
  // The row the sampling steps see: `row` itself, or its processed copy when the request biases,
  // penalises or constrains (`extra`: tokens generated after generated_, e.g. accepted drafts
  // before a verify row; the constraint's mask is the one after them).
  const float* processed_row(const float* row, const SamplingParams& sp, std::span<const int32_t> extra = {});
  // Emitted tokens advance the request's constraint (a token it refuses is a bug upstream: kInternal).
  Status constrain_emitted(const SamplingParams& sp, std::span<const int32_t> toks);
  int backoff_next_ = 0;  // plain steps the next unpaying round imposes
  int backoff_left_ = 0;  // plain steps still to take before drafting again
  // The prompt being prefilled (begin_prefill .. its last finish_prefill): positions
  // [pf_next_, pf_end_) are still to run; pf_planned_ rows are in the step being built.
  std::vector<int32_t> pf_prompt_;
  const PromptEmbeddings* pf_embeds_ = nullptr;
  int64_t pf_next_ = 0, pf_end_ = 0, pf_planned_ = 0, pf_replay_ = 0;
  // The decode round between plan_next and finish_next.
  struct Round {
    enum class Kind { kNone, kPlain, kVerify } kind = Kind::kNone;
    enum class Prep { kNone, kPlain, kDraft } prep = Prep::kNone;  // between prepare_next and plan_drafted
    model::DraftJob job;           // Prep::kDraft: the draft request
    model::DraftPicker pick;       // its picker (sampled or constrained drafts); job.pick points here
    std::vector<int32_t> chain;    // the picker's drafts so far
    Rng draws;                     // the sampled picker's stream
    int64_t L = 0;                 // drafts verified (kVerify)
    int32_t anchor = 0;
    model::DraftOutput d;          // the draft block (kVerify)
    std::vector<Candidates> q;     // the chain's distributions (sampled kVerify)
    double t0 = 0, t1 = 0;         // draft start / end
  } round_;
};

// The outputs of rows [first_row, first_row + n_rows) of a step, as if they had been a step of
// their own: their logits rows, and their tap rows from max(first_row, the step's taps_first_row)
// (taps_first_row relative to first_row). tap_w = n_taps * dim (0: no taps).
// Whether a request reads its logits rows (sampling, processed or constrained rows, logprobs);
// false: its greedy tokens come from StepOutput::argmax (Step::logits_to_host).
inline bool reads_logit_rows(const SamplingParams& sp, bool logprobs) {
  return logprobs || !sp.greedy() || sp.processes_logits() || sp.constraint != nullptr;
}
// Whether the step holds prompt rows (the last one's logits row is kept: checkpoints, the first token).
inline bool has_prefill_rows(const model::Step& st) {
  for (const model::Row& r : st.rows)
    if (r.kind == model::RowKind::kPrefill) return true;
  return false;
}

model::StepOutput rows_of(const model::StepOutput& all, int64_t n_step_rows, int64_t first_row, int64_t n_rows, int64_t vocab,
                          int64_t tap_w);

}  // namespace fb::engine
