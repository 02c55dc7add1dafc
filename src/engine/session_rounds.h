// Several sessions at a given context, measured (issue 20's device bench; `flashbox bench
// --synthetic --sessions 1,2,4,8,16`): N sessions are prefilled with synthetic prompts of
// `context` tokens, then decode in rounds of ONE step carrying every session's row (or DSpark
// verify block, the drafts in one draft_many call), as the engine's rounds do: aggregate tokens/s,
// rows per step and the round time (each session's inter-token gap) at p50/p99/max. The arrival
// case: `arrival_streams` sessions decode while a prompt of `arrival_prompt` tokens comes in beside
// them, chunked by engine::PrefillPolicy; their worst gap during the prefill against their median
// gap before it. No tokenizer (the device build has none): greedy sampling on token ids.
// With `fill_context` the sessions' contexts (and the arrival prompt's first part) are written by
// the caller instead of prefilled (the GPU bench fakes them: bench/fake_context.h), so a run costs
// its decode rounds, not 16 x 4K prompts; `log` gets one line per phase.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/executor.h"

namespace fb::engine {

struct SessionRoundsOptions {
  std::vector<int> sessions = {1, 2, 4, 8, 16};
  int64_t context = 4096;     // prompt tokens of every session before it decodes
  int rounds = 32;            // timed decode rounds per session count (after 2 untimed ones)
  bool dspark = false;
  int prefill_chunk = 0;      // 0: the executor's preference
  int64_t arrival_prompt = 0; // 0: no arrival case
  int arrival_streams = 7;
  int arrival_before = 16;    // decode rounds timed before the prompt arrives
  double step_factor = 2.0;   // PrefillPolicyOptions::step_factor
  int64_t fixed_rows = 0;     // PrefillPolicyOptions::fixed_rows (0: measured)
  uint64_t seed = 1;
  // Brings a fresh session (no positions) to holding `tokens` at positions [0, tokens.size())
  // without the generator (Generator::adopt_context takes it from there). Null: real prefill.
  std::function<Status(model::SessionState& s, std::span<const int32_t> tokens)> fill_context;
  // With fill_context: the arrival prompt's last `arrival_tail` tokens are prefilled beside the
  // streams, the rest filled (the gap is measured at the prompt's dearest positions, its end);
  // 0: the whole prompt is prefilled.
  int64_t arrival_tail = 0;
  // One line per phase and session count (what runs, elapsed seconds); null: silent.
  std::function<void(const std::string&)> log;
  int64_t log_every_rounds = 200;  // and every this many rounds of the arrival's prefill
};

struct SessionRoundsRow {
  int sessions = 0;
  double tok_s = 0;            // tokens of all sessions / time of the timed rounds
  double rows_per_step = 0;
  double gap_p50_ms = 0, gap_p99_ms = 0, gap_max_ms = 0;  // round times
  double step_p50_ms = 0;  // the executor's forward() of the round (the rest: host planning, drafts, sampling)
  std::vector<int32_t> first_session_tokens;  // session 0's tokens over the timed rounds
};

struct ArrivalResult {
  double median_gap_ms = 0;  // the streams' rounds before the prompt arrived
  double worst_gap_ms = 0;   // ... while it prefilled (its last chunk included)
  int64_t worst_round = -1;  // which round (0 = the first with the prompt), its prompt rows and its step time
  int64_t worst_prefill_rows = 0;
  double worst_step_ms = 0;
  double prefill_s = 0;      // arrival to the prompt's last chunk
  int64_t rounds = 0;        // rounds while it prefilled (reference steps included)
  int64_t reference_steps = 0;
  int64_t last_chunk = 0;    // the policy's last mixed chunk
  int64_t prefilled_rows = 0;  // prompt rows prefilled beside the streams (all but a filled prefix)
};

struct SessionRoundsResult {
  std::vector<SessionRoundsRow> rows;
  bool has_arrival = false;
  ArrivalResult arrival;
};

Result<SessionRoundsResult> run_session_rounds(model::Executor& ex, const SessionRoundsOptions& o);

}  // namespace fb::engine
