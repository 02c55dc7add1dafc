// Executor: the backend interface the engine, check-fixture and benchmarks drive. The CPU
// reference and the CUDA executor implement it; callers never know which one runs.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "model/config.h"
#include "model/executor_stats.h"
#include "model/step.h"

namespace fb::model {

// A session's caches, owned by the executor that made it (host or device memory).
class SessionState {
 public:
  virtual ~SessionState() = default;
  virtual int64_t n_pos() const = 0;
  // Forget positions >= p (DSpark rejections, edited conversations); see implementations for
  // how far back this can go.
  virtual Status rollback(int64_t p) = 0;
};

// Named taps: where two paths part. after_block is the contract used by check-fixture; `named`
// holds finer stages ("L3.attn_norm", "L3.q", "L3.sel", ...) as f32 when `detailed` is set.
struct Taps {
  bool enabled = false;
  bool detailed = false;
  std::vector<std::vector<uint16_t>> after_block;  // [layer] bf16 [rows, hc, dim]
  std::map<std::string, std::vector<float>> named;
  // Layer gate (check-fixture, CLARIFICATIONS "Fixture gates"): replace block l's input (X
  // [rows, hc, dim] f32, rounded to bf16, and the carried pre [rows, hc]) before it runs, and on
  // Engram layers the Engram module's input [rows, hc, dim], so each block's error is measured
  // in isolation from the layers before it. Each map holds the step's rows.
  std::map<int, std::vector<float>> inject_x, inject_pre, inject_engram_in;
  // With `probe` set the executor records, per backbone block, what the gate compares (f32).
  struct BlockProbe {
    std::vector<float> engram_out;  // [rows, hc, dim] streams after the Engram module (Engram layers)
    std::vector<float> attn_out;    // [rows, dim] attention sublayer output (before hc_post)
    std::vector<float> ffn_out;     // [rows, dim] MoE sublayer output (before hc_post)
    // Per row: the smallest relative boundary gap (model::selection_margin) of the selections
    // the sublayer used, by the executor's own scores: the attention's (indexer top-k and the
    // candidate pool it was restricted to, possibly reused from a source layer), and the router's
    // together with the attention's for the MoE (its input depends on both). +inf: none partial.
    std::vector<float> attn_margin, ffn_margin;
  };
  bool probe = false;
  std::map<int, BlockProbe> blocks;
};

struct DraftOutput {
  std::vector<int32_t> ids;       // [anchor, d1..dB]
  std::vector<float> logits;      // f32 [B, vocab], Markov-corrected
  std::vector<float> confidence;  // f32 [B], raw confidence logits
};

// Chooses chain token x_k (k = 1..B) from the Markov-corrected draft row l_k (f32 [vocab]): the
// `draw` of spec/13 §4.6. Sampled requests draw from their own transform of the row.
using DraftPicker = std::function<int32_t(int64_t k, const float* logits_row)>;

// One session's draft block in a call of Executor::draft_many: draft(session, anchor, tap_row, p)
// when pick is null, else draft_sampled(..., *pick).
struct DraftJob {
  SessionState* session = nullptr;
  int32_t anchor = 0;
  const uint16_t* tap_row = nullptr;
  int64_t p = 0;
  const DraftPicker* pick = nullptr;
  // false: the caller reads only ids and confidences, so an executor may leave DraftOutput::logits
  // empty (a greedy block's rows are 2.6 MB at the released size; a picker always gets its rows)
  bool want_logits = true;
};

// draft_sampled's default on a greedy block `d`: keeps its rows while `pick` agrees with its chain
// and ends the block at the first pick that differs (later rows were biased by the greedy token).
inline void keep_agreeing_picks(DraftOutput& d, const DraftPicker& pick) {
  const int64_t B = int64_t(d.ids.size()) - 1;
  if (B <= 0) return;
  const int64_t V = int64_t(d.logits.size()) / B;
  int64_t keep = 0;
  while (keep < B) {
    const int32_t x = pick(keep + 1, &d.logits[size_t(keep * V)]);
    const bool agrees = x == d.ids[size_t(keep + 1)];
    d.ids[size_t(++keep)] = x;
    if (!agrees) break;
  }
  d.ids.resize(size_t(keep + 1));
  d.logits.resize(size_t(keep * V));
  if (int64_t(d.confidence.size()) > keep) d.confidence.resize(size_t(keep));
}

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const Config& config() const = 0;
  virtual const char* name() const = 0;
  virtual std::unique_ptr<SessionState> new_session() const = 0;
  // Whether forward() honours Row::replay_start (SWA bounded replay, spec/11 §8.4). Callers ask
  // before sending such rows: an executor without it would run them exactly.
  virtual bool supports_bounded_replay() const { return false; }
  // Whether forward() takes prefill rows of several sessions in one step (issue 20: prompts that
  // arrive together share a step instead of one short chunk each). Without it the engine puts one
  // prompt's rows in a step. The CUDA executor does not say so yet (its prefill path per step
  // composition is not shown to keep results apart per session).
  virtual bool packs_prompts() const { return false; }
  // Prompt rows per prefill step that suit this executor when the user names none ([policy]:
  // larger steps amortise per-step weight reads; outputs do not depend on it on the CPU).
  virtual int64_t preferred_prefill_chunk() const { return 256; }
  // Runs the backbone over the rows; sessions[i] serves rows with session == i.
  virtual Result<StepOutput> forward(const Step& step, const std::vector<SessionState*>& sessions, Taps* taps = nullptr) = 0;
  // DSpark: write committed positions' tap rows (bf16 [n, n_taps*dim]) into the draft rings.
  virtual Status draft_commit(SessionState& s, int64_t first_pos, const uint16_t* tap_rows, int64_t n) = 0;
  // forward_spec(anchor, g(p), p): ring write of p, then one draft block.
  virtual Result<DraftOutput> draft(SessionState& s, int32_t anchor, const uint16_t* tap_row, int64_t p) = 0;
  // draft() with the chain drawn by `pick` instead of argmax: row k's Markov bias (and
  // confidence) uses the token picked for row k-1 (spec/13 §4.6-4.7). The default runs the
  // greedy draft() and keeps its rows while the picks agree with its chain; the block ends at
  // the first pick that differs (later rows were biased by the greedy token), so ids may hold
  // fewer than B proposals. That is still exact for speculative sampling: the cut depends only
  // on drafts already drawn. Executors that own the chain override it to draw all B rows.
  virtual Result<DraftOutput> draft_sampled(SessionState& s, int32_t anchor, const uint16_t* tap_row, int64_t p,
                                            const DraftPicker& pick) {
    auto r = draft(s, anchor, tap_row, p);
    if (r.ok()) keep_agreeing_picks(r.value(), pick);
    return r;
  }
  // The draft blocks of several sessions in one call (issue 20: the engine drafts every DSpark
  // session of a round at once, so an executor can read the draft stages' weights once for all).
  // Sessions are distinct. Outputs in job order, each exactly what draft() / draft_sampled() gives
  // for that job alone (row invariance; a picker is called only for its own job, in k order).
  // The default runs the jobs one after the other; an executor that batches them overrides it.
  virtual std::vector<Result<DraftOutput>> draft_many(const std::vector<DraftJob>& jobs) {
    std::vector<Result<DraftOutput>> out;
    out.reserve(jobs.size());
    for (const DraftJob& j : jobs)
      out.push_back(j.pick ? draft_sampled(*j.session, j.anchor, j.tap_row, j.p, *j.pick) : draft(*j.session, j.anchor, j.tap_row, j.p));
    return out;
  }
  // A 64-bit identity of the loaded model (0: none); the disk KV cache keeps states per identity.
  virtual uint64_t identity() const { return 0; }
  // Host milliseconds the last forward() spent issuing its work before it waited for the device
  // (0: not measured; the CPU executor computes while it issues). Near the step's wall time it
  // says the device waited on the host.
  virtual double last_enqueue_ms() const { return 0; }
  // Counters for the dashboard (model/executor_stats.h): expert traffic by tier, step time by op
  // family. Call on the thread that calls forward() (the engine copies them after each step);
  // default: none.
  virtual ExecutorStats stats() const { return {}; }
  // Session state as plain bytes and back (DESIGN-AHEAD item 4, docs/formats.md "Session state"):
  // the bytes name the model that wrote them; restore validates everything before it changes `s`.
  virtual Result<std::string> save_session(const SessionState& s) const {
    return FB_ERROR(kUnsupported) << name() << " executor does not serialize sessions yet";
  }
  virtual Status restore_session(SessionState& s, std::string_view bytes) const {
    return FB_ERROR(kUnsupported) << name() << " executor does not serialize sessions yet";
  }
  // The vision tower (spec/14 §4-§5) on this executor's device: patches bf16 [nvh*nvw, 3*p*p] of
  // ONE image -> aligner rows bf16 [ceil(nvh/r) * ceil(nvw/r), dim] in reading order; `vit`
  // (optional) receives the ViT output bf16 [nvh*nvw, vision_dim]. Bit-identical across executors.
  virtual Result<std::vector<uint16_t>> encode_image(const std::vector<uint16_t>& patches, int nvh, int nvw,
                                                     std::vector<uint16_t>* vit = nullptr) {
    return FB_ERROR(kUnsupported) << name() << " executor does not run the vision tower";
  }
  // The learned START, NEWLINE and END rows of an image span (spec/14 §6.1), in that order:
  // bf16 [3, dim] on the host. With encode_image's rows they make the span's input rows
  // (vision::span_embeddings); the engine asks once and keeps them.
  virtual Result<std::vector<uint16_t>> image_span_markers() const {
    return FB_ERROR(kUnsupported) << name() << " executor does not run the vision tower";
  }
};

}  // namespace fb::model
