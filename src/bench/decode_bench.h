// Decode and verify timing over any model::Executor: one-row decode steps at the session's
// context (median ms), multi-row verify steps (1..6 rows, rolled back so the context stays put),
// draft calls, and the bytes a batch-1 decode step must read (spec/12 §2) for the roofline share.
#pragma once

#include <functional>
#include <vector>

#include "base/status.h"
#include "model/executor.h"

namespace fb::bench {

struct DecodeTiming {
  double decode_ms = 0;                 // median one-row step
  std::vector<double> verify_ms;        // [r - 1] median step with r decode rows (r = 1..max)
  double draft_ms = 0;                  // median DSpark draft call (0 if no draft stages)
  double enqueue_ms = 0;                // median host time to issue a one-row step (Executor::last_enqueue_ms)
};

// Runs on a session already at its context (prefilled or filled). `steps` timed repetitions.
Result<DecodeTiming> time_decode(model::Executor& ex, model::SessionState& s, int steps, int max_verify_rows);

// One decode row at position L (token from L and k), asking for logits.
model::Step decode_row_step(const model::Config& c, int64_t L, int k);

// `steps` decode steps of `rows` rows at the session's context, each rolled back (profiling, the
// tier benches); ms: each step's forward wall time appended when not null.
// on_step (optional) after each step: progress of long runs.
Status run_decode_steps(model::Executor& ex, model::SessionState& s, int steps, int rows = 1, std::vector<double>* ms = nullptr,
                        const std::function<void()>& on_step = {});
// `n` DSpark draft calls at the session's context (for profiling; no-op without draft stages).
Status run_drafts(model::Executor& ex, model::SessionState& s, int n);

// Bytes one batch-1 decode step must read at context L (weights in their executor formats +
// cache rows), and its FLOPs. wo_a_bf16: the executor holds wo_a as BF16 (twice the FP8 bytes).
struct StepCost {
  double weight_bytes = 0, cache_bytes = 0, flops = 0;
};
StepCost decode_step_cost(const model::Config& c, int64_t L, bool wo_a_bf16);

}  // namespace fb::bench
